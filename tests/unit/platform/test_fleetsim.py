"""The fleet simulator's pure parts: the demand curve, the queue model, pod views, the kwok annotation.

Test design: worked examples from the docstrings as table tests; the queue model is stepped by hand
(dt = 1 s) so every number can be checked on paper. No cluster, no clock.
"""

from __future__ import annotations

import math

import pytest
from chatfleet_platform.load.fleetsim import (
    DayCurve,
    QueueModel,
    Replica,
    Surge,
    erlang_c,
    kwok_load_annotation,
    pod_view,
    replicas_for,
    serving_pods,
    split_counts,
    stationary_wait,
)

pytestmark = pytest.mark.harness  # the simulated fleet (test infrastructure), not the product

ONE_SLOT = Replica(capacity_rps=1.0, service_seconds=1.0, load_seconds=0)
TEN = Replica(capacity_rps=10.0, service_seconds=2.0, load_seconds=40)


class TestDayCurve:
    @pytest.mark.parametrize(
        ("t", "rate"),
        [
            pytest.param(-5, 0.0, id="before the start: nothing"),
            pytest.param(0, 12.0, id="night"),
            pytest.param(180, 60.0, id="peak at half a day"),
            pytest.param(360, 12.0, id="night again"),
            pytest.param(540, 60.0, id="repeats: next day's peak"),
        ],
    )
    def test_daily_shape(self, t: float, rate: float) -> None:
        assert DayCurve(12, 60, 360).rate(t) == pytest.approx(rate)

    def test_rises_monotonically_from_night_to_peak(self) -> None:
        c = DayCurve(12, 60, 360)
        rates = [c.rate(t) for t in range(0, 181)]
        assert rates == sorted(rates)

    @pytest.mark.parametrize(
        ("t", "share"),
        [
            pytest.param(95, 0.0, id="before"),
            pytest.param(105, 0.5, id="half way up"),
            pytest.param(110, 1.0, id="all of it within 10 s"),
            pytest.param(170, 1.0, id="held"),
            pytest.param(175, 0.5, id="half way down"),
            pytest.param(181, 0.0, id="after"),
        ],
    )
    def test_surge_ramp(self, t: float, share: float) -> None:
        assert Surge(at=100, factor=5, rise=10, hold=60).ramp(t) == pytest.approx(share)

    def test_surge_is_five_times_the_level_it_started_from(self) -> None:
        plain, surged = DayCurve(12, 60, 360), DayCurve(12, 60, 360, surges=(Surge(at=0, hold=30),))
        assert surged.rate(10) == pytest.approx(plain.rate(10) + 4 * 12)
        assert surged.rate(0) == pytest.approx(12) and surged.rate(10) > 5 * 12 - 1

    def test_peak_over_sees_a_short_surge_between_samples(self) -> None:
        c = DayCurve(10, 10, 360, surges=(Surge(at=100.3, factor=5, rise=0.2, hold=0.1),))
        assert c.peak_over(90, 110, step=5) == pytest.approx(50)

    def test_json_round_trip(self) -> None:
        c = DayCurve(12, 60, 360, surges=(Surge(at=54),))
        assert DayCurve.from_json(c.to_json()) == c


class TestQueueing:
    @pytest.mark.parametrize(
        ("servers", "offered", "chance"),
        [
            pytest.param(2, 1.0, 1 / 3, id="m=2 a=1"),
            pytest.param(1, 0.5, 0.5, id="M/M/1: C = rho"),
            pytest.param(4, 0.0, 0.0, id="no load"),
            pytest.param(4, 4.0, 1.0, id="saturated"),
            pytest.param(0, 1.0, 1.0, id="no servers"),
        ],
    )
    def test_erlang_c(self, servers: int, offered: float, chance: float) -> None:
        assert erlang_c(servers, offered) == pytest.approx(chance)

    def test_erlang_c_is_stable_for_thousands_of_slots(self) -> None:
        assert 0 < erlang_c(4000, 3900) < 1

    def test_stationary_wait_worked_example(self) -> None:
        mean, p95 = stationary_wait(1.0, 2, ONE_SLOT)
        assert mean == pytest.approx(1 / 3)
        assert p95 == pytest.approx(math.log((1 / 3) / 0.05))

    def test_stationary_wait_is_finite_in_overload(self) -> None:
        mean, p95 = stationary_wait(100.0, 2, TEN)
        assert math.isfinite(mean) and math.isfinite(p95)

    @pytest.mark.parametrize(
        ("rate", "replicas"),
        [
            pytest.param(60, 8, id="60 rps at <= 85 % -> 8"),
            pytest.param(12, 2, id="night"),
            pytest.param(0, 1, id="never below one"),
        ],
    )
    def test_replicas_for(self, rate: float, replicas: int) -> None:
        assert replicas_for(rate, TEN) == replicas

    def test_slots(self) -> None:
        assert TEN.slots == 20


class TestQueueModel:
    def test_overload_builds_a_fluid_backlog_and_drains(self) -> None:
        q = QueueModel(TEN)
        # tick 1: 30 rps on 2 x 10 rps: 10 requests left over, they wait 10 / 20 = 0.5 s
        s = q.step(30, 2, 1.0)
        assert (s.backlog, s.admitted, s.fluid_wait) == pytest.approx((10, 20, 0.5))
        # tick 2: demand falls to 10 rps: the backlog drains at the spare 10 rps
        s = q.step(10, 2, 1.0)
        assert s.backlog == pytest.approx(0) and s.admitted == pytest.approx(20)
        # tick 3: no backlog, light load: only the (tiny) stationary wait
        s = q.step(10, 2, 1.0)
        assert s.fluid_wait == 0 and s.wait_p95 < 0.01

    def test_no_capacity_waits_as_if_one_replica_came_up(self) -> None:
        q = QueueModel(TEN)
        s = q.step(20, 0, 1.0)
        assert s.admitted == 0 and s.fluid_wait == pytest.approx(20 / 10)

    def test_requests_past_the_timeout_are_dropped(self) -> None:
        q = QueueModel(TEN, timeout=5.0)
        s = q.step(100, 1, 1.0)  # 90 over one replica's 10 rps; 5 s x 10 rps = 50 may wait
        assert s.backlog == pytest.approx(50) and s.timed_out == pytest.approx(40)
        assert s.fluid_wait == pytest.approx(5.0)

    def test_inflight_is_littles_law_at_light_load(self) -> None:
        s = QueueModel(TEN).step(10, 4, 1.0)
        assert s.inflight == pytest.approx(10 * 2.0, rel=0.01)

    @pytest.mark.parametrize(
        ("total", "carry", "pods", "counts", "left"),
        [
            pytest.param(7.5, 0.0, 2, [4, 3], 0.5, id="fraction carried"),
            pytest.param(0.5, 0.5, 3, [1, 0, 0], 0.0, id="carry completes one"),
            pytest.param(3.0, 0.0, 0, [], 0.0, id="no pods: nothing counted"),
        ],
    )
    def test_split_counts(self, total, carry, pods, counts, left) -> None:
        assert split_counts(total, carry, pods) == (counts, pytest.approx(left))


def _pod(name: str, *, ready_at: str | None, serving: str | None = None, deleting: bool = False) -> dict:
    labels = {"chatfleet.io/service": "chat", "chatfleet.io/track": "stable"}
    if serving is not None:
        labels["chatfleet.io/serving"] = serving
    meta = {"name": name, "namespace": "ns", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}] if ready_at else []
    return {
        "metadata": meta,
        "spec": {
            "nodeName": "gpu-node-0",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running", "conditions": conditions},
    }


class TestPods:
    T = 1767225600.0  # 2026-01-01T00:00:00Z

    def test_pod_view(self) -> None:
        v = pod_view(_pod("a", ready_at="2026-01-01T00:00:00Z"))
        assert (v.bound, v.gpus, v.ready_since, v.track) == (True, 1, self.T, "stable")

    def test_deleting_pod_neither_serves_nor_holds(self) -> None:
        v = pod_view(_pod("a", ready_at="2026-01-01T00:00:00Z", deleting=True))
        assert v.ready_since is None and not v.bound

    @pytest.mark.parametrize(
        ("pods", "now", "names"),
        [
            pytest.param([_pod("a", ready_at="2026-01-01T00:00:00Z")], T + 39, [], id="still loading"),
            pytest.param([_pod("a", ready_at="2026-01-01T00:00:00Z")], T + 40, ["a"], id="loaded"),
            pytest.param(
                [_pod("a", ready_at="2026-01-01T00:00:00Z", serving="false")], T + 90, [], id="warm standby"
            ),
            pytest.param(
                [_pod("a", ready_at="2026-01-01T00:00:00Z", serving="true")], T + 90, ["a"], id="joined"
            ),
            pytest.param([_pod("a", ready_at=None)], T + 90, [], id="not Ready"),
        ],
    )
    def test_serving_pods(self, pods, now, names) -> None:
        assert [p.name for p in serving_pods(map(pod_view, pods), now, 40)] == names


STAGES = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  delay:
    durationMilliseconds: 0
    durationFrom: {expressionFrom: '.metadata.annotations["sim.chatfleet.io/load-delay"]'}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
"""


class TestKwokAnnotation:
    def test_found(self) -> None:
        assert kwok_load_annotation(STAGES) == "sim.chatfleet.io/load-delay"

    def test_absent(self) -> None:
        assert kwok_load_annotation(STAGES.split("---")[1]) is None

    def test_the_platform_stages_name_the_model_load_annotation(self) -> None:
        from chatfleet_platform.common.config import REPO_ROOT

        stages = (REPO_ROOT / "hack" / "chatfleet_platform" / "cluster" / "kwok-stages.yaml").read_text()
        assert kwok_load_annotation(stages) == "sim.chatfleet.io/model-load-delay"
