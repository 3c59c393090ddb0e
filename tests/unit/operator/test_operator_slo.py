"""The time-to-first-token SLO: a sustained breach raises the floor at once; a met SLO releases it.

Test design: `slo_step` on a table of measurements over an injected clock (a blip, a sustained breach,
the wait of one model load before a second raise, the release after twice that long met, an error);
then passes through the fake API client with a fake Prometheus whose p95 answer the test sets, on the
reconcile tests' clock moved forward: the Deployment's replicas and the autoscaler's minimum follow the
floor in the pass that decides, and a fleet within its SLO writes nothing.
"""

from __future__ import annotations

from datetime import timedelta

from chatfleet_operator.autoscale.measure import Autoscaling
from chatfleet_operator.autoscale.slo import p95_ttft_query, slo_step
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import ScalingSpec, SloSpec
from operator_helpers import cbs_body
from test_operator_reconcile import NODES, NOW, FakeClient

SLO = SloSpec(ttft_p95_milliseconds=400, breach_seconds=5)


def at(seconds: float):
    return NOW + timedelta(seconds=seconds)


def test_the_spec_parses_with_its_defaults():
    a = ScalingSpec.from_dict({"autoscale": {"slo": {"timeToFirstTokenP95Milliseconds": 400}}}).autoscale
    assert a is not None and a.slo == SLO and a.slo.check_seconds == 2.5
    assert ScalingSpec.from_dict({"autoscale": {}}).autoscale.slo is None  # type: ignore[union-attr]
    assert 'model="bot"' in p95_ttft_query("shop", "bot") and "histogram_quantile(0.95" in p95_ttft_query(
        "s", "b"
    )


def test_a_blip_raises_nothing_a_sustained_breach_raises_the_floor():
    st = slo_step(SLO, None, 900.0, at(0), total=4, max_replicas=20)
    assert st["breachingSince"] == "2026-11-21T10:00:00Z" and "floor" not in st
    st = slo_step(SLO, st, 100.0, at(2), total=4, max_replicas=20)  # a blip: over, then met
    assert "breachingSince" not in st and "floor" not in st
    st = slo_step(SLO, st, 900.0, at(4), total=4, max_replicas=20)
    st = slo_step(SLO, st, 900.0, at(8), total=4, max_replicas=20)
    assert "floor" not in st  # 4 s over: not yet
    st = slo_step(SLO, st, 900.0, at(9), total=4, max_replicas=20)
    assert st["floor"] == 8 and st["raisedAt"] == "2026-11-21T10:00:09Z"  # 900/400 - 1 > 100 %: doubled
    assert (
        st["reason"]
        == "p95 time to first token 900 ms over 400 ms for 5 s: floor none -> 8 (4 replicas before)"
    )


def test_the_next_raise_waits_one_model_load_and_stays_within_max():
    st = {"breachingSince": "2026-11-21T10:00:00Z"}
    st = slo_step(SLO, st, 500.0, at(5), total=4, max_replicas=6, load_seconds=40)
    assert st["floor"] == 5  # 25 % over: one more replica
    st = slo_step(SLO, st, 500.0, at(30), total=5, max_replicas=6, load_seconds=40)
    assert st["floor"] == 5  # the new pod is still loading: no judgement yet
    st = slo_step(SLO, st, 500.0, at(45), total=5, max_replicas=6, load_seconds=40)
    assert st["floor"] == 6
    assert st["reason"].endswith("floor 5 -> 6 (maxReplicas) (5 replicas before)")
    st = slo_step(SLO, st, 5000.0, at(90), total=6, max_replicas=6, load_seconds=40)
    assert st["floor"] == 6 and st["raisedAt"] == "2026-11-21T10:00:45Z"  # at maxReplicas: nothing new


def test_a_met_slo_releases_the_floor_after_twice_the_settle_time():
    st = {"floor": 6, "raisedAt": "2026-11-21T10:00:00Z", "breachingSince": "2026-11-21T09:59:50Z"}
    st = slo_step(SLO, st, 300.0, at(10), total=6, max_replicas=10, load_seconds=20)
    assert st["floor"] == 6 and st["metSince"] == "2026-11-21T10:00:10Z" and "breachingSince" not in st
    st = slo_step(SLO, st, 300.0, at(49), total=6, max_replicas=10, load_seconds=20)
    assert st["floor"] == 6  # met 39 s < 2 x 20 s
    st = slo_step(SLO, st, None, at(50), total=6, max_replicas=10, load_seconds=20)  # no traffic: met
    assert "floor" not in st and "metSince" not in st and "floor 6 released" in st["reason"]


def test_an_error_changes_nothing_but_says_why():
    st = {"floor": 6, "raisedAt": "2026-11-21T10:00:00Z"}
    out = slo_step(SLO, st, None, at(100), total=6, max_replicas=10, error="Prometheus did not answer")
    assert out["floor"] == 6 and out["error"] == "Prometheus did not answer"
    assert "error" not in slo_step(SLO, out, 100.0, at(101), total=6, max_replicas=10)


SPEC = {
    "model": {"uri": "hf://a/b"},
    "analysis": {"prometheusAddress": "http://prometheus.monitoring.svc:9090"},
    "scaling": {
        "replicas": 2,  # the HPA's last word (the scale subresource)
        "autoscale": {
            "minReplicas": 2,
            "maxReplicas": 10,
            "targets": {"inFlightRequests": 4},
            "slo": {"timeToFirstTokenP95Milliseconds": 400, "breachSeconds": 5},
        },
    },
}


class Fleet:
    def __init__(self) -> None:
        self.p95: float | None = 100.0
        self.queries: list[str] = []
        self.edge = Autoscaling(
            serves_keda=lambda: False, range_query=self._range, instant_query=self._instant
        )
        self.client, self.snap, self.body = FakeClient(), Snapshot(nodes=NODES), cbs_body(SPEC)

    def _range(self, *args):
        raise AssertionError("no forecast asked for")

    def _instant(self, address, promql):
        self.queries.append(promql)
        return self.p95

    def run(self, seconds: float):
        self.client.writes.clear()
        out = reconcile_pass(
            self.client, self.body, self.snap, World(), Settings(), at(seconds), autoscaling=self.edge
        )
        self.body["status"] = out.status
        return out

    def replicas(self) -> tuple[int, int]:
        dep, hpa = (
            self.snap.children[("Deployment", "bot")],
            self.snap.children[("HorizontalPodAutoscaler", "bot")],
        )
        return dep["spec"]["replicas"], hpa["spec"]["minReplicas"]


def test_a_sustained_breach_grows_the_deployment_and_the_minimum_in_the_deciding_pass():
    fleet = Fleet()
    out = fleet.run(0)
    assert fleet.replicas() == (2, 2) and out.requeue_after == 2.5  # the next check
    assert out.status["autoscaling"]["slo"] == {"targetMilliseconds": 400}
    fleet.run(1)
    assert len(fleet.queries) == 1  # not due: measured every breachSeconds / 2
    out = fleet.run(3)
    assert out.writes == 0  # within the SLO: nothing written
    fleet.p95 = 1000.0
    fleet.run(6)
    assert fleet.body["status"]["autoscaling"]["slo"]["breachingSince"] == "2026-11-21T10:00:06Z"
    assert fleet.replicas() == (2, 2)
    out = fleet.run(11)
    assert fleet.replicas() == (4, 4)  # the Deployment and the HPA's minimum in the same pass
    assert out.status["desiredReplicas"] == 4 and out.status["autoscaling"]["slo"]["floor"] == 4


def test_prometheus_down_keeps_the_floor_and_says_so():
    fleet = Fleet()
    fleet.body["status"] = {"autoscaling": {"slo": {"floor": 5, "raisedAt": "2026-11-21T10:00:00Z"}}}

    def down(address, promql):
        raise ConnectionError("connection refused")

    fleet.edge = Autoscaling(serves_keda=lambda: False, range_query=fleet._range, instant_query=down)
    out = fleet.run(1)
    assert fleet.replicas() == (5, 5) and "did not answer" in out.status["autoscaling"]["slo"]["error"]
    assert out.problems == []
