"""desired_children: each child built once per track from the release plan (stable kept, canary added, split)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from chatfleet_operator.api import Reason
from chatfleet_operator.converge.diagnose import Problem
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.converge.status import Observation, apply_gate, compute_status
from chatfleet_operator.intents import Gate
from chatfleet_operator.release.children import serving_revision
from chatfleet_operator.release.strategy import ReleasePlan, ReleaseReason
from pass_helpers import NOW, by_key, context, pass_children

OLD = {"model": {"uri": "hf://org/m", "revision": "v1"}, "scaling": {"replicas": 2}}
NEW = {**OLD, "model": {"uri": "hf://org/m", "revision": "v2"}}


def observed(raw):
    """The children as the cluster holds them after a steady state on `raw`."""
    ctx = context(raw)
    _, desired = pass_children(ctx)
    # the revision hashes the effective spec (with the operator's defaults filled in: defaults.py)
    return {(m["kind"], m["metadata"]["name"]): copy.deepcopy(m) for m in desired}, ctx.update_revision


def run(raw, children, pods, status, traffic="ReplicaRatio"):
    ctx = context(raw, children=children, pods=pods, status=status, traffic=traffic)
    plan, desired = pass_children(ctx)
    out = SimpleNamespace(desired=desired, plan=plan, serving_revision=serving_revision(ctx, plan))
    return ctx.update_revision, out


def test_steady_state_is_the_base_with_a_both_tracks_service():
    children, rev = observed(OLD)
    _, out = run(OLD, children, [], {"stableRevision": rev})
    d = by_key(out.desired)
    assert not out.plan.in_release
    assert d[("Deployment", "bot")]["spec"]["replicas"] == 2
    assert d[("Service", "bot")]["spec"]["selector"] == {"chatfleet.io/service": "bot"}
    assert ("Deployment", "bot-canary") not in d


def test_release_keeps_stable_template_and_adds_the_canary():
    children, old_rev = observed(OLD)
    pods = [PodFacts(f"bot-{i}", old_rev, "stable", "Running", True) for i in range(2)]
    new_rev, out = run(NEW, children, pods, {"stableRevision": old_rev})
    assert new_rev != old_rev == context(OLD).update_revision
    d = by_key(out.desired)
    stable = d[("Deployment", "bot")]
    assert stable["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == old_rev
    assert not [k for k in d if k[0] == "ConfigMap"]  # the configs ride in the templates
    canary = d[("Deployment", "bot-canary")]
    assert canary["spec"]["replicas"] == 1
    assert canary["spec"]["selector"]["matchLabels"]["chatfleet.io/track"] == "canary"
    assert canary["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == new_rev
    config = "triton.chatfleet.io/chat.config.pbtxt"
    assert config in canary["spec"]["template"]["metadata"]["annotations"]
    assert (
        stable["spec"]["template"]["metadata"]["annotations"][config]
        == (children[("Deployment", "bot")]["spec"]["template"]["metadata"]["annotations"][config])
    )  # stable keeps the old revision's config
    kinds = [m["kind"] for m in out.desired]
    assert kinds.index("Service") < kinds.index("Deployment")  # traffic objects first
    obs = Observation(2, out.serving_revision, 2, 1, "http://bot", "sel", None)
    status = compute_status({}, obs, NOW, out.plan.status_fields(new_rev))
    assert status["canaryRevision"] == new_rev and status["release"]["phase"] == "Progressing"
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Reconciling"] == "Releasing"


def test_httproute_mode_builds_route_and_track_services():
    children, old_rev = observed(OLD)
    pods = [PodFacts(f"bot-{i}", old_rev, "stable", "Running", True) for i in range(2)]
    new_rev, out = run(NEW, children, pods, {"stableRevision": old_rev}, traffic="HTTPRoute")
    route = by_key(out.desired)[("HTTPRoute", "bot")]
    assert [b["weight"] for b in route["spec"]["rules"][-1]["backendRefs"]] == [100, 0]  # no Ready canary yet
    assert out.plan.canary_weight == 10
    children[("Deployment", "bot-canary")] = by_key(out.desired)[("Deployment", "bot-canary")]
    pods.append(PodFacts("bot-canary-0", new_rev, "canary", "Running", True))
    _, out = run(NEW, children, pods, {"stableRevision": old_rev}, traffic="HTTPRoute")
    d = by_key(out.desired)
    route = d[("HTTPRoute", "bot")]
    assert [b["weight"] for b in route["spec"]["rules"][-1]["backendRefs"]] == [90, 10]
    assert d[("Service", "bot-canary")]["spec"]["selector"]["chatfleet.io/track"] == "canary"
    assert d[("Service", "bot")]["spec"]["selector"]["chatfleet.io/track"] == "stable"


@pytest.mark.parametrize(
    ("gate", "stalled"),
    [
        pytest.param(
            Gate(
                "paused",
                ReleaseReason.ANALYSIS_ERROR,
                "Release paused: Prometheus at http://p did not answer",
            ),
            "False",
            id="prometheus-outage",
        ),
        pytest.param(
            Gate("paused", ReleaseReason.NO_TRAFFIC, "Release paused: no traffic on the canary"),
            "False",
            id="no-traffic",
        ),
        pytest.param(
            Gate("progressing", ReleaseReason.RELEASING, "Step 1/3: weight 10%"), "False", id="progressing"
        ),
        pytest.param(
            Gate("stalled", ReleaseReason.ROLLED_BACK, "Rolled back: error rate"), "True", id="rolled-back"
        ),
    ],
)
def test_stalled_reason_and_message_agree(gate, stalled):
    """Every condition's message explains its reason; a problem reason never says "No problem found"."""
    conds = {c["type"]: c for c in apply_gate([], gate, 2)}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == (stalled, gate.reason)
    for cond in conds.values():
        assert gate.message in cond["message"] or cond["type"] == "Reconciling", cond
        assert "No problem found" not in cond["message"], cond


@pytest.mark.parametrize("kind", ["paused", "progressing"])
def test_a_problem_outranks_a_release_gate(kind):
    """A spec problem (e.g. an analysis target the operator may not call) stays visible during a release."""
    problem = Problem(
        Reason.INVALID_ANALYSIS_TARGET, "spec.analysis.prometheusAddress 'http://x': not allowed"
    )
    obs = Observation(1, "r1", 2, 1, "http://bot", "sel", None, problems=[problem])
    gate = Gate(kind, ReleaseReason.ANALYSIS_ERROR, "Release paused: spec.analysis.prometheusAddress ...")
    plan = ReleasePlan(True, False, 2, 1, gate=gate)
    status = compute_status({}, obs, NOW, plan.status_fields("r2"))
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == (
        "True",
        Reason.INVALID_ANALYSIS_TARGET,
    )
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", Reason.INVALID_ANALYSIS_TARGET)
    assert conds["Reconciling"]["reason"] == gate.reason  # the release's own state is still shown


def test_a_new_operator_default_image_is_released_like_a_spec_change():
    """A fleet that names no image, stable on the operator's old default: an operator with a new default
    image starts a canary release of it (stable kept on the old image), as a spec change would."""
    from dataclasses import replace

    from chatfleet_operator.defaults import ClusterDefaults
    from chatfleet_operator.settings import RuntimeSettings, Settings

    children, rev = observed(OLD)
    runtime = replace(
        RuntimeSettings(), defaults=replace(ClusterDefaults(), runtime_image="registry.example/rt:2")
    )
    ctx = context(
        OLD, children=children, status={"stableRevision": rev}, settings=replace(Settings(), runtime=runtime)
    )
    plan, desired = pass_children(ctx)
    assert ctx.update_revision != rev and plan.in_release
    d = by_key(desired)
    images = {
        k[1]: {c["image"] for c in v["spec"]["template"]["spec"]["containers"]}
        for k, v in d.items()
        if k[0] == "Deployment"
    }
    assert images["bot"] == {ClusterDefaults().runtime_image} and images["bot-canary"] == {
        "registry.example/rt:2"
    }
