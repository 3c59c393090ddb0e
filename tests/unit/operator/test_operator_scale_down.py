"""spec.scaling.autoscale.forecast.scaleDown: Forecast: scale-down follows the forecast, not a fixed window.

Test design: with Forecast the autoscaler's scale-down stabilization window is the forecast's interval
while the forecast holds a floor (the floor keeps what the coming lead needs), and the spec's window again
while the forecast fails; Window (the default) keeps the spec's window. Checked on the pure rule and on a
pass, for the HPA and for KEDA's ScaledObject.
"""

from __future__ import annotations

import copy

import pytest
from chatfleet_operator.autoscale.forecast import scale_down_seconds
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import ScalingSpec
from operator_helpers import cbs_body
from test_operator_autoscale import SPEC as FORECAST_SPEC
from test_operator_autoscale import scaling
from test_operator_reconcile import NODES, NOW, FakeClient


def spec_with(mode: str | None, window: int = 300) -> dict:
    spec = copy.deepcopy(FORECAST_SPEC)
    spec["scaling"]["autoscale"]["scaleDownStabilizationSeconds"] = window
    if mode is not None:
        spec["scaling"]["autoscale"]["forecast"]["scaleDown"] = mode
    return spec


@pytest.mark.parametrize(
    "mode, forecast, window, seconds",
    [
        ("Forecast", {"requestsPerSecond": 42.0}, 300, 60),  # the interval (60): the floor guards
        ("Forecast", {"requestsPerSecond": 42.0}, 30, 30),  # never longer than the spec's own window
        ("Forecast", {"consecutiveErrors": 2}, 300, 300),  # failing: no floor, the window again
        ("Forecast", None, 300, 300),  # no forecast yet
        ("Window", {"requestsPerSecond": 42.0}, 300, 300),
        (None, {"requestsPerSecond": 42.0}, 300, 300),  # the default is Window
    ],
)
def test_the_scale_down_window(mode, forecast, window, seconds):
    autoscale = ScalingSpec.from_dict(spec_with(mode, window)["scaling"]).autoscale
    assert autoscale is not None
    assert scale_down_seconds(autoscale, forecast) == seconds


@pytest.mark.parametrize("keda, kind", [(False, "HorizontalPodAutoscaler"), (True, "ScaledObject")])
def test_a_pass_gives_the_autoscaler_the_forecasts_window(keda, kind):
    def window(obj: dict) -> int:
        spec = obj["spec"]
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] if keda else spec["behavior"]
        return behavior["scaleDown"]["stabilizationWindowSeconds"]

    ramp = [30.0 + 2 * i for i in range(12)]
    for mode, series, error, want in (
        ("Forecast", ramp, None, 60),
        ("Forecast", None, "connection refused", 300),
        ("Window", ramp, None, 300),
    ):
        client, snap, body = FakeClient(), Snapshot(nodes=NODES), cbs_body(spec_with(mode))
        edge = scaling(keda=keda, series=series, error=error)
        reconcile_pass(client, body, snap, World(), Settings(), NOW, autoscaling=edge)
        assert window(snap.children[(kind, "bot")]) == want, (mode, error)
