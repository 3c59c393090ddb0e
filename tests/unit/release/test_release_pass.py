"""Releases.measure_if_due: a measurement only when due, through the provider; discovery picks the traffic mode."""

from __future__ import annotations

import copy
from datetime import timedelta
from types import SimpleNamespace

from chatfleet_operator.analysis.assess import Sample
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.converge.status import EventIntent, pass_events
from chatfleet_operator.release.children import desired_children, plan_pass
from chatfleet_operator.release.measure import Releases
from pass_helpers import NOW, context, pass_children

OLD = {
    "model": {"uri": "hf://org/m", "revision": "v1"},
    "scaling": {"replicas": 2},
    "analysis": {"intervalSeconds": 10},
}
NEW = {**OLD, "model": {"uri": "hf://org/m", "revision": "v2"}}


class FakeProvider:
    def __init__(self, sample):
        self.sample, self.calls = sample, 0

    def measure(self, plan, now):
        self.calls += 1
        assert plan.canary_track == "canary" and plan.window_seconds == 20
        return self.sample(now)


def children_and_rev(raw):
    ctx = context(raw)
    _, desired = pass_children(ctx)
    return {(m["kind"], m["metadata"]["name"]): copy.deepcopy(m) for m in desired}, ctx.update_revision


def run(releases, raw, children, pods, status, now):
    """Steps 1-2 of a pass: measure when due, then plan the release and its children."""
    ctx = releases.measure_if_due(context(raw, children=children, pods=pods, status=status, now=now))
    plan = plan_pass(ctx)
    return SimpleNamespace(plan=plan, desired=desired_children(ctx, plan))


def test_measures_only_when_due_and_folds_the_verdict():
    provider = FakeProvider(lambda now: Sample(now, 5.0, {"error rate": 9.0}, {"error rate": 0.1}))
    releases = Releases(provider=provider)
    children, old_rev = children_and_rev(OLD)
    # pass 1: the release starts; no canary pod Ready yet -> no measurement
    out = run(releases, NEW, children, [], {"stableRevision": old_rev}, NOW)
    assert provider.calls == 0 and out.plan.release.phase == "Progressing"
    status = {"stableRevision": old_rev, "release": out.plan.release.to_status()}
    new_rev = out.plan.release.revision
    children.update({(m["kind"], m["metadata"]["name"]): m for m in out.desired})
    pods = [PodFacts("c-0", new_rev, "canary", "Running", True)]
    # pass 2: canary Ready -> analysis from one 20 s window later; nothing measured yet
    out = run(releases, NEW, children, pods, status, NOW + timedelta(seconds=1))
    assert provider.calls == 0 and out.plan.release.analysis_from == "2026-11-21T10:00:21Z"
    status["release"] = out.plan.release.to_status()
    # pass 3, at analysisFrom: measured: error rate 9% > 1% -> failed 1
    out = run(releases, NEW, children, pods, status, NOW + timedelta(seconds=21))
    assert provider.calls == 1 and out.plan.release.analysis["failed"] == 1
    status["release"] = out.plan.release.to_status()
    # pass 4, 5 s later: not due -> no query
    run(releases, NEW, children, pods, status, NOW + timedelta(seconds=26))
    assert provider.calls == 1


def test_traffic_mode_from_discovery_is_cached():
    calls = []
    releases = Releases(
        provider=FakeProvider(lambda now: Sample(now)), serves_gateway_api=lambda: calls.append(1) or True
    )
    assert releases.traffic_mode() == "HTTPRoute" and releases.traffic_mode() == "HTTPRoute"
    assert len(calls) == 1
    failing = Releases(provider=FakeProvider(lambda now: Sample(now)), serves_gateway_api=lambda: 1 / 0)
    assert failing.traffic_mode() == "ReplicaRatio"


def test_pass_events_drop_a_second_event_of_the_same_reason():
    old = {"conditions": []}
    new = {
        "conditions": [
            {"type": "Stalled", "status": "True", "reason": "RolledBack", "message": "from status"}
        ]
    }
    merged = pass_events(
        old,
        new,
        [EventIntent("Warning", "RolledBack", "x"), EventIntent("Normal", "ReleaseStarted", "y")],
    )
    assert [e.reason for e in merged] == ["RolledBack", "ReleaseStarted"]
