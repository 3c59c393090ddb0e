"""How an upgrade's observers read the fleets (chatfleet_platform.load.upgrades), checked on fixed objects.

Test design: `classify` is pure. A fleet counts as rolling only while it is on the new template (the chat
API's CPU) and not rolled out; a fleet still on the old template is neither rolling nor done; only a
held condition with status True counts as held; an upgrade is finished only when every fleet is done and
none is held.
"""

from __future__ import annotations

import pytest
from chatfleet_platform.load.upgrades import chat_api_cpu, classify, replacing, rolling

pytestmark = pytest.mark.harness


def dep(name: str, cpu: str, *, generation: int = 2, observed: int = 2, replicas: int = 1, updated: int = 1,
        available: int = 1) -> dict:  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "ns", "generation": generation},
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "triton", "resources": {"limits": {"cpu": "250m"}}},
                        {"name": "chat-api", "resources": {"limits": {"cpu": cpu}}},
                    ]
                }
            },
        },
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "updatedReplicas": updated,
            "availableReplicas": available,
        },
    }


def bot(name: str, *conditions: tuple[str, str, str]) -> dict:
    conds = [{"type": t, "status": s, "reason": r} for t, s, r in conditions]
    return {"metadata": {"name": name, "namespace": "ns"}, "status": {"conditions": conds}}


def test_the_chat_apis_cpu_is_read_from_the_template():
    assert chat_api_cpu(dep("a", "200m")) == "200m"
    no_api = dep("a", "200m")
    no_api["spec"]["template"]["spec"]["containers"].pop()
    assert chat_api_cpu(no_api) == ""


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, False),  # rolled out
        ({"observed": 1}, True),  # the controller has not seen the new generation
        ({"replicas": 2, "updated": 1}, True),  # an old pod still up beside the new one
        ({"updated": 0}, True),  # no pod on the new template yet
        ({"available": 0}, True),  # the new pod not available yet
    ],
)
def test_a_deployment_rolls_until_its_new_pods_are_all_there_and_available(kw, expected):
    assert rolling(dep("a", "200m", **kw)) is expected


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, False),  # rolled out
        ({"replicas": 2}, True),  # an old pod still up beside the new one
        ({"updated": 0}, True),  # the old pod gone, the new one not there yet (in place)
        ({"available": 0}, True),  # the new pod not available yet
        ({"generation": 3, "replicas": 2}, False),  # a generation not seen yet: nothing to say
    ],
)
def test_a_deployment_replaces_pods_while_two_templates_run_or_new_pods_are_not_available(kw, expected):
    assert replacing(dep("a", "200m", **kw)) is expected


def test_a_write_that_bumps_the_generation_without_a_new_template_is_no_roll():
    """The operator's Deployment-level write to a fleet already on the template: unobserved generation,
    all pods updated and available -- not replacing (rolling() says not done until it is observed)."""
    d = dep("a", "200m", generation=3, observed=2)
    assert rolling(d) and not replacing(d)
    assert classify([d], [], "200m").rolling == ()


def test_only_fleets_on_the_new_template_count_and_held_needs_status_true():
    deps = [dep("a", "200m", replicas=2), dep("b", "200m"), dep("c", "150m", replicas=2)]
    bots = [bot("c", ("UpgradeHeld", "True", "UpgradeQueued")), bot("b", ("UpgradeHeld", "False", "X"))]
    s = classify(deps, bots, "200m")
    assert s.rolling == ("ns/a",) and s.done == ("ns/b",) and s.fleets == 3
    assert s.held == {"ns/c": "UpgradeQueued"}
    assert not s.finished


def test_an_upgrade_is_finished_when_every_fleet_is_done_and_none_held():
    deps = [dep("a", "200m"), dep("b", "200m")]
    assert classify(deps, [bot("a"), bot("b")], "200m").finished
    assert not classify(deps, [bot("a", ("UpgradeHeld", "True", "UpgradeHalted"))], "200m").finished
    assert not classify([], [], "200m").finished
