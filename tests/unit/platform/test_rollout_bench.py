"""The rollout benchmark's fairness rules (bench/rollout_bench.py), checked without a cluster.

Test design: the Argo Rollouts objects must ask the same questions as the ChatbotService (same PromQL
strings, limits, interval and steps), and the outside clock must read the state in force at a moment;
both are pure and checked on tables. No speed is asserted (benchmarks are not tests).
"""

from __future__ import annotations

import sys

import pytest
from chatfleet_operator.analysis import provider
from chatfleet_operator.spec import AnalysisSpec
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import rollout_bench as rb

pytestmark = pytest.mark.harness


@pytest.mark.parametrize(
    ("steps", "argo"),
    [
        pytest.param([(20, 10)], [{"setWeight": 20}, {"pause": {"duration": "10s"}}], id="weight-then-pause"),
        pytest.param(
            [(50, 2), (100, 0)],
            [{"setWeight": 50}, {"pause": {"duration": "2s"}}, {"setWeight": 100}],
            id="no-pause-left-out",
        ),
    ],
)
def test_argo_steps_mirror_chatfleet_steps(steps, argo):
    assert rb.argo_steps(steps) == argo


def test_argo_analysis_asks_what_the_chatfleet_release_asks():
    spec = rb.chatfleet_spec("http://127.0.0.1:9090", "r1", rb.HOLD, rb.INTERVAL)
    plan = provider.measurement_request("argo-x", rb.SERVICE, _Spec(spec), "canary")
    template = rb.argo_analysis_template("argo-x", "http://127.0.0.1:9090", rb.INTERVAL, rb.FAILURE_LIMIT)
    metrics = template["spec"]["metrics"]
    target = rb.queries.Target("argo-x", rb.SERVICE, "canary")
    assert [m["provider"]["prometheus"]["query"] for m in metrics] == [
        q.promql(target, plan.window_seconds) for q in plan.metrics
    ]
    assert [m["successCondition"] for m in metrics] == [
        f"result[0] <= {q.check.max_value:g}" for q in plan.metrics
    ]
    assert {(m["interval"], m["failureLimit"]) for m in metrics} == {
        ("10s", spec["analysis"]["failureLimit"])
    }


def test_argo_rollout_labels_its_revision_and_aborts_at_the_deadline():
    ro = rb.argo_rollout("r3", rb.HOLD, unready=True)["spec"]
    labels = ro["template"]["metadata"]["labels"]
    assert labels[rb.REV_LABEL] == "r3" and labels["sim.chatfleet.io/health"] == "unready"
    assert ro["progressDeadlineAbort"] is True and ro["progressDeadlineSeconds"] == rb.PROGRESS_DEADLINE


def snap(ready=(), pods=()):
    return {"ready": set(ready), "endpoints": set(ready), "pods": set(pods)}


@pytest.mark.parametrize(
    ("t0", "expected"),
    [
        pytest.param(1.0, 3.0, id="canary-served-at-t0-gone-at-3"),
        pytest.param(3.5, 3.5, id="already-gone-at-t0"),
        pytest.param(0.5, 3.0, id="before-any-snapshot"),
    ],
)
def test_first_after_reads_the_state_in_force(t0, expected):
    w = rb.Watcher.__new__(rb.Watcher)
    w._lock = rb.threading.Lock()
    w.history = [
        (1.0, snap(ready={("bot-a", "r0"), ("bot-c", "r1")})),
        (2.0, snap(ready={("bot-a", "r0"), ("bot-c", "r1"), ("bot-b", "r0")})),
        (3.0, snap(ready={("bot-a", "r0"), ("bot-b", "r0")})),
    ]
    assert w.first_after(t0, rb.no_ready_pod_of("r1")) == expected


class _Spec:
    """The parts of a ChatbotServiceSpec measurement_request reads."""

    def __init__(self, spec: dict) -> None:
        self.analysis = AnalysisSpec.from_dict(spec["analysis"])
