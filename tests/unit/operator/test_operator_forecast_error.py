"""spec.scaling.autoscale.warmPool.fromForecastError: standbys sized from the forecast's error.

Test design: the forecast reports how far off it may be (the fit's RMS one-step residual x sqrt(lead in
steps)); the standbys are ceil(1.645 x error / requestsPerReplica), at least warmPool.replicas, within
maxReplicas; a forecast that is not recomputed keeps its error; a pass runs them beside the serving pods
and says so in status.autoscaling.forecast. A clean curve has a small error, a noisy one a larger one.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
from chatfleet_operator.autoscale.forecast import Demand, error_standbys, forecast_peak
from chatfleet_operator.autoscale.state import forecast_status
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import ScalingSpec
from operator_helpers import cbs_body
from test_operator_autoscale import SPEC as FORECAST_SPEC
from test_operator_autoscale import scaling
from test_operator_reconcile import NODES, NOW, FakeClient


def day(noise: float, scale: float = 1.0, seed: int = 3) -> list[float]:
    """Three seasons of a 48-sample day between 10 and 50 req/s (times `scale`), with Gaussian noise of
    `noise` req/s."""
    rng = random.Random(seed)
    clean = [scale * (30 - 20 * math.cos(2 * math.pi * i / 48)) for i in range(3 * 48)]
    return [v + rng.gauss(0, noise) if noise else v for v in clean]


def test_the_forecast_says_how_far_off_it_may_be():
    clean = forecast_peak(day(0.0), 1800, 86400, 1800)
    noisy = forecast_peak(day(4.0), 1800, 86400, 1800)
    assert clean.error_rps is not None and noisy.error_rps is not None
    assert clean.error_rps < 1.0 < noisy.error_rps  # noise of 4 req/s: an error of about that
    assert 2.0 < noisy.error_rps < 8.0
    # a longer lead (4 steps) is less sure: sqrt(4) = 2x the one-step error
    longer = forecast_peak(day(4.0), 1800, 86400, 4 * 1800)
    assert longer.error_rps == pytest.approx(2 * noisy.error_rps, rel=0.01)
    assert forecast_peak([1.0, 2.0], 60, 3600, 60).error_rps is None  # no forecast, no error


@pytest.mark.parametrize(
    "error, per_replica, standbys",
    [
        (6.0, 7.0, 2),
        (4.2, 7.0, 1),
        (0.001, 7.0, 0),  # a clean history's error (seen in the fair benchmark): no standby for it
        (0.0, 7.0, 0),
        (None, 7.0, 0),
        (6.0, None, 0),
        (30.0, 10.0, 5),
    ],
)
def test_the_standbys_that_cover_the_error(error, per_replica, standbys):
    assert error_standbys(error, per_replica) == standbys


def test_the_spec_parses_and_turns_the_pool_on():
    s = ScalingSpec.from_dict({"autoscale": {"warmPool": {"fromForecastError": True}}})
    assert s.autoscale is not None and s.autoscale.pool_from_forecast_error and s.pooled and s.warm_pool == 0
    assert not ScalingSpec.from_dict({"autoscale": {"warmPool": {"replicas": 0}}}).pooled


def autoscale(from_error: bool):
    spec = copy.deepcopy(FORECAST_SPEC["scaling"])
    spec["autoscale"]["warmPool"] = {"replicas": 1, "fromForecastError": from_error}
    a = ScalingSpec.from_dict(spec).autoscale
    assert a is not None
    return a


def test_the_forecast_status_carries_the_error_and_its_standbys_until_the_next_forecast():
    fc = forecast_status(autoscale(True), None, NOW, 100, Demand(42.0, "Holt-Winters", 25.0))
    assert fc["errorRequestsPerSecond"] == 25.0 and fc["standbys"] == 5  # ceil(1.645 * 25 / 10)
    kept = forecast_status(autoscale(True), fc, NOW, 100, None)  # not due: the stored one
    assert kept["errorRequestsPerSecond"] == 25.0 and kept["standbys"] == 5
    off = forecast_status(autoscale(False), None, NOW, 100, Demand(42.0, "Holt-Winters", 25.0))
    assert "standbys" not in off  # without fromForecastError the error is said, not acted on
    failed = forecast_status(autoscale(True), fc, NOW, 100, None, "Prometheus did not answer")
    assert "errorRequestsPerSecond" not in failed and failed["standbys"] == 0


def body_with(from_error: bool, replicas: int = 1):
    spec = copy.deepcopy(FORECAST_SPEC)
    spec["scaling"]["autoscale"]["warmPool"] = {"replicas": replicas, "fromForecastError": from_error}
    return cbs_body(spec)


@pytest.mark.parametrize(
    "from_error, noise, more_than_fixed", [(True, 12.0, True), (False, 12.0, False), (True, 0.0, False)]
)
def test_a_pass_runs_the_standbys_the_error_asks_for(from_error, noise, more_than_fixed):
    client, snap, body = FakeClient(), Snapshot(nodes=NODES), body_with(from_error)
    series = day(noise, scale=1 / 3)  # 3-17 req/s: a floor of 1-2 replicas of 10 req/s, room for more
    out = reconcile_pass(client, body, snap, World(), Settings(), NOW, autoscaling=scaling(series=series))
    fc = out.status["autoscaling"]["forecast"]
    pool = out.status["autoscaling"]["warmPool"]["desired"]
    dep = snap.children[("Deployment", "bot")]
    assert dep["spec"]["replicas"] == out.status["desiredReplicas"] + pool
    if from_error:
        assert pool == max(1, fc["standbys"]) and "errorRequestsPerSecond" in fc
    assert (pool > 1) == more_than_fixed, fc


def test_the_error_never_takes_the_pool_past_max_replicas():
    client, snap, body = FakeClient(), Snapshot(nodes=NODES), body_with(True, replicas=0)
    body["spec"]["scaling"]["autoscale"]["maxReplicas"] = 3
    series = day(40.0, scale=1 / 3)  # wild: an error of about 40 req/s, 7 standbys of 10 req/s
    out = reconcile_pass(client, body, snap, World(), Settings(), NOW, autoscaling=scaling(series=series))
    fc = out.status["autoscaling"]["forecast"]
    assert fc["standbys"] > 3
    serving = out.status["desiredReplicas"]
    assert out.status["autoscaling"]["warmPool"]["desired"] == max(0, 3 - serving)
