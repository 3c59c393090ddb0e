"""A pod-template change that is not a release (e.g. an operator upgrade) must not deadlock on GPUs.

Test design: the Deployment's own rolling update follows spec.rollout.gpuCapacity like releases do --
Surge: maxSurge 1 / maxUnavailable 0; ReplaceInPlace: maxSurge 0 / maxUnavailable 1; Auto: surge until a
stable pod of the new template cannot be scheduled for lack of nvidia.com/gpu, then in place until that
rollout is done. Decided by a pure function from what the pass observed; checked through the builder
and through the children of a pass with injected pods.
"""

from __future__ import annotations

import copy

import pytest
from chatfleet_operator.cache import Snapshot
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.release.children import template_update_in_place
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef
from pass_helpers import context, pass_children

REF = ObjectRef("ns", "bot", "uid-1", 1)
NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
SURGE = {"maxSurge": 1, "maxUnavailable": 0}
IN_PLACE = {"maxSurge": 0, "maxUnavailable": 1}


def pending(name: str = "bot-new-0", track: str = "stable", message: str = NO_GPU) -> PodFacts:
    """A stable pod the scheduler cannot place."""
    return PodFacts(name, "r1", track, "Pending", False, unschedulable_message=message)


def running(name: str) -> PodFacts:
    """A Ready stable pod."""
    return PodFacts(name, "r1", "stable", "Running", True)


def strategy_of(raw: dict, snap: Snapshot) -> dict:
    """The rolling-update parameters of the stable Deployment a pass would apply."""
    _, desired = pass_children(context(raw, children=snap.children, pods=snap.pods, ref=REF))
    dep = next(m for m in desired if m["kind"] == "Deployment")
    return dep["spec"]["strategy"]["rollingUpdate"]


def observed(strategy: dict, *, rolled_out: bool) -> dict:
    """The stable Deployment as observed: its strategy, and whether its rollout is done."""
    raw = {"model": {"uri": "hf://org/m"}, "scaling": {"replicas": 2}}
    _, desired = pass_children(context(raw, ref=REF))
    dep = copy.deepcopy(next(m for m in desired if m["kind"] == "Deployment"))
    dep["spec"]["strategy"]["rollingUpdate"] = dict(strategy)
    dep["metadata"]["generation"] = 2
    updated = 2 if rolled_out else 1
    dep["status"] = {
        "observedGeneration": 2,
        "replicas": 2 if rolled_out else 3,
        "updatedReplicas": updated,
        "readyReplicas": 2,
        "availableReplicas": 2,
    }
    return dep


def spec_with(capacity: str | None) -> dict:
    """A two-replica spec with spec.rollout.gpuCapacity (None: left to the default, Auto)."""
    raw: dict = {"model": {"uri": "hf://org/m"}, "scaling": {"replicas": 2}}
    if capacity:
        raw["rollout"] = {"gpuCapacity": capacity}
    return raw


@pytest.mark.parametrize(
    ("capacity", "pods", "observed_strategy", "rolled_out", "expected"),
    [
        pytest.param("Surge", [pending()], SURGE, False, SURGE, id="surge-waits-as-asked"),
        pytest.param("ReplaceInPlace", [], SURGE, True, IN_PLACE, id="in-place-always"),
        pytest.param(None, [running("a"), running("b")], SURGE, True, SURGE, id="auto-gpus-free-surge"),
        pytest.param(None, [running("a"), running("b"), pending()], SURGE, False, IN_PLACE, id="auto-no-gpu"),
        pytest.param(
            None,
            [running("a"), running("b"), pending(message="0/4 nodes are available: 4 Insufficient memory.")],
            SURGE,
            False,
            SURGE,
            id="auto-short-of-memory-not-gpus",
        ),
        pytest.param(
            None, [pending(track="canary")], SURGE, False, SURGE, id="auto-canary-pod-is-the-release"
        ),
        pytest.param(
            None, [running("a"), running("b")], IN_PLACE, False, IN_PLACE, id="auto-sticky-mid-rollout"
        ),
        pytest.param(
            None, [running("a"), running("b")], IN_PLACE, True, SURGE, id="auto-back-to-surge-after"
        ),
    ],
)
def test_stable_rolling_update_follows_gpu_capacity(capacity, pods, observed_strategy, rolled_out, expected):
    children = {("Deployment", "bot"): observed(observed_strategy, rolled_out=rolled_out)}
    assert strategy_of(spec_with(capacity), Snapshot(children=children, pods=pods)) == expected


def test_pure_decision_without_an_observed_deployment():
    assert template_update_in_place("Auto", None, []) is False
    assert template_update_in_place("ReplaceInPlace", None, []) is True


def test_builder_takes_the_rolling_update():
    from chatfleet_operator.builders import build_deployment

    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}})
    dep = build_deployment(REF, spec, PodSettings(), revision="r", replicas=1, in_place=True)
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": IN_PLACE}
    dep = build_deployment(REF, spec, PodSettings(), revision="r", replicas=1)
    assert dep["spec"]["strategy"]["rollingUpdate"] == SURGE
