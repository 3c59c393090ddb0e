"""Releases.measure_if_due: a measurement only when due, through the provider; discovery picks the traffic mode."""

from __future__ import annotations

import copy
from datetime import timedelta
from types import SimpleNamespace

from chatfleet_operator.analysis.assess import Sample
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.converge.status import pass_events
from chatfleet_operator.intents import EventIntent
from chatfleet_operator.release.children import desired_children, plan_pass
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.timefmt import rfc3339
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


STICKY = {
    **NEW,
    "rollout": {"stickyDialogues": {"enabled": True, "idleSeconds": 60, "maxDrainSeconds": 600}},
}


class QueryProvider(FakeProvider):
    """Answers the drain's one query with `answer` (a number, or an exception to raise)."""

    def __init__(self, answer):
        super().__init__(lambda now: Sample(now, 5.0, {"error rate": 0.0}, {"error rate": 0.0}))
        self.answer, self.queries = answer, []

    def query(self, address, promql):
        self.queries.append((address, promql))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def draining(children_rev, now=NOW, **release):
    """A status in the drain phase of revision `new` over stable `old`."""
    old_rev, new_rev = children_rev
    rel = {"revision": new_rev, "fromRevision": old_rev, "phase": "DrainingDialogues", "stepIndex": 2}
    rel.update(
        {
            "strategy": "canary",
            "traffic": "HTTPRoute",
            "capacity": "Surge",
            "drainStartedAt": "2026-11-21T10:00:00Z",
        }
    )
    return {"stableRevision": old_rev, "release": {**rel, **release}}


def drain_pass(releases, status, now):
    children, old_rev = children_and_rev(OLD)
    new_rev = context(STICKY).update_revision
    pods = [PodFacts(f"s-{i}", old_rev, "stable", "Running", True) for i in range(2)]
    pods += [PodFacts(f"c-{i}", new_rev, "canary", "Running", True) for i in range(2)]
    ctx = releases.measure_if_due(
        context(STICKY, children=children, pods=pods, status=status, now=now, traffic="HTTPRoute")
    )
    plan = plan_pass(ctx)
    return plan, desired_children(ctx, plan)


def test_the_drain_asks_prometheus_for_the_stable_tracks_recent_requests_once_an_interval():
    provider = QueryProvider(3.0)
    releases = Releases(provider=provider)
    old_rev, new_rev = children_and_rev(OLD)[1], context(STICKY).update_revision
    status = draining((old_rev, new_rev))
    plan, _ = drain_pass(releases, status, NOW + timedelta(seconds=5))
    assert provider.queries == [
        (
            "http://prometheus.monitoring.svc:9090",
            'sum(increase(chatfleet_requests_total{namespace="ns",model="bot",track="stable"}[60s]))',
        )
    ]
    assert plan.release.phase == "DrainingDialogues" and plan.release.old_revision_requests == 3
    # 4 s later: not due (interval 10 s) -> no query, the figure kept
    status = {**status, "release": plan.release.to_status()}
    plan, _ = drain_pass(releases, status, NOW + timedelta(seconds=9))
    assert len(provider.queries) == 1 and plan.release.old_revision_requests == 3


def test_the_drain_route_pins_each_revision_and_sends_new_dialogues_to_the_canary():
    releases = Releases(provider=QueryProvider(2.0))
    old_rev, new_rev = children_and_rev(OLD)[1], context(STICKY).update_revision
    _, desired = drain_pass(releases, draining((old_rev, new_rev)), NOW + timedelta(seconds=5))
    route = next(m for m in desired if m["kind"] == "HTTPRoute")
    rules = route["spec"]["rules"]
    pinned = {r["matches"][0]["headers"][0]["value"]: r["backendRefs"][0]["name"] for r in rules[:-1]}
    assert pinned == {old_rev: "bot", new_rev: "bot-canary"}
    assert [b["weight"] for b in rules[-1]["backendRefs"]] == [0, 100]
    stable = next(m for m in desired if m["kind"] == "Deployment" and m["metadata"]["name"] == "bot")
    assert stable["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == old_rev


def test_dialogues_ended_promote_and_the_route_pins_only_the_new_revision():
    releases = Releases(provider=QueryProvider(None))  # no series: stable served nothing
    old_rev, new_rev = children_and_rev(OLD)[1], context(STICKY).update_revision
    plan, desired = drain_pass(releases, draining((old_rev, new_rev)), NOW + timedelta(seconds=5))
    assert plan.release.phase == "Promoting"
    route = next(m for m in desired if m["kind"] == "HTTPRoute")
    pinned = {
        r["matches"][0]["headers"][0]["value"]: r["backendRefs"][0]["name"]
        for r in route["spec"]["rules"][:-1]
    }
    assert pinned == {new_rev: "bot-canary"}  # stable's pods are mixed while it rolls to the new revision


def test_an_unreachable_prometheus_holds_the_drain_and_says_why():
    releases = Releases(provider=QueryProvider(ConnectionError("Connection refused")))
    old_rev, new_rev = children_and_rev(OLD)[1], context(STICKY).update_revision
    plan, _ = drain_pass(releases, draining((old_rev, new_rev)), NOW + timedelta(seconds=5))
    assert plan.release.phase == "DrainingDialogues"
    assert (
        "not measured (Prometheus at http://prometheus.monitoring.svc:9090 did not answer: connection refused)"
        in plan.gate.message
    )


def test_only_a_routed_canary_waits_for_the_route_to_settle():
    from chatfleet_operator.context import route_settle_seconds

    blue_green = {**NEW, "rollout": {"strategy": "blueGreen"}}
    assert route_settle_seconds(context(NEW, traffic="HTTPRoute")) == 10.0
    assert route_settle_seconds(context(NEW, traffic="ReplicaRatio")) == 0.0
    assert route_settle_seconds(context(blue_green, traffic="HTTPRoute")) == 0.0


def routed_pass(children, status, pods, now, traffic="HTTPRoute"):
    """A pass over NEW; the children it wants are added to `children` (the cluster after it)."""
    ctx = context(NEW, children=children, pods=pods, status=status, now=now, traffic=traffic)
    plan = plan_pass(ctx)
    children.update({(m["kind"], m["metadata"]["name"]): m for m in desired_children(ctx, plan)})
    return plan


def test_a_routed_step_sends_its_canary_users_only_once_the_gateway_can_have_read_its_endpoint():
    """The gateway reads the canary Service's EndpointSlices a moment after the pod turns Ready; a weight
    given at once was answered 503 `no available server` for that moment (the real-pod zero-drop test
    through Traefik: 7 of 2,627 turns)."""
    children, old_rev = children_and_rev(OLD)
    status = {"stableRevision": old_rev}
    first = routed_pass(children, status, [], NOW)
    status["release"] = first.release.to_status()
    new_rev = first.release.revision
    ready_at = NOW + timedelta(seconds=10)
    pods = [PodFacts("c-0", new_rev, "canary", "Running", True, ready_since=rfc3339(ready_at))]

    young = routed_pass(children, status, pods, ready_at + timedelta(seconds=1))
    assert young.route_weight == 0 and young.release.effective_weight == 0
    assert young.requeue_after <= 2.0  # looked at again once the pod has joined
    joined = routed_pass(children, status, pods, ready_at + timedelta(seconds=3))
    assert joined.route_weight is None and joined.release.effective_weight == joined.release.weight > 0
    # no route, no join: the replica ratio moves as soon as the pod is Ready
    ratio = routed_pass(children, status, pods, ready_at + timedelta(seconds=1), traffic="ReplicaRatio")
    assert ratio.route_weight is None and ratio.release.effective_weight > 0


def test_joined_canary_counts_pods_ready_for_the_join_and_says_when_the_next_joins():
    from chatfleet_operator.release.strategy import joined_canary

    children, old_rev = children_and_rev(OLD)
    status = {"stableRevision": old_rev}
    rel = routed_pass(children, status, [], NOW).release
    status["release"] = rel.to_status()
    now = NOW + timedelta(seconds=30)

    def pod(name, ready_for, ready=True):
        since = rfc3339(now - timedelta(seconds=ready_for)) if ready_for is not None else ""
        return PodFacts(name, rel.revision, "canary", "Running", ready, ready_since=since)

    def joined(pods, traffic="HTTPRoute"):
        return joined_canary(
            context(NEW, children=children, pods=pods, status=status, now=now, traffic=traffic)
        )

    # the step's canary asks for one pod (Track.ready counts no more than the Deployment asks for)
    assert joined([pod("a", 1)]) == (0, 2.0)
    assert joined([pod("a", 5)]) == (1, None)
    assert joined([pod("a", 5), pod("b", 1)]) == (1, 2.0)
    assert joined([pod("a", 1)], traffic="ReplicaRatio") == (1, None)
    assert joined([pod("a", None)]) == (1, None)  # no time of its Ready condition: counted
    assert joined([pod("a", 5, ready=False)]) == (0, None)
