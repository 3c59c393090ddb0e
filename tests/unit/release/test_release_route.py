"""A canary behind an HTTPRoute the Gateway refuses: no step counts, the status says why, and it resumes.

Test design: the tick-by-tick World of release_sim.py (1 tick = 1 s) behind an HTTPRoute of 4 replicas,
with the parent Gateway's word set as a scenario knob (`w.route`, what release/route.py reads from the
route's status.parents); the fake Prometheus finds passing figures unless a test says otherwise, as a
probe that reaches the canary's Service straight would (the shadow phase too). Then one pass's plan from
the route as the watch cache holds it (pass_helpers), and route_gated's table.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from chatfleet_operator.analysis.assess import ERROR, FAILED, INCONCLUSIVE, SUCCESSFUL, Measurement
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.release.route import RouteState, route_gated
from chatfleet_operator.release.state import ReleasePhase
from chatfleet_operator.release.strategy import ReleaseReason
from chatfleet_operator.release.traffic import HTTPROUTE
from chatfleet_operator.settings import ReleaseSettings, Settings
from pass_helpers import by_key, context, pass_children
from release_sim import World, world

REFUSED = RouteState(
    "False",
    "NotAllowedByListeners",
    "Gateway ns/chatfleet does not accept HTTPRoute bot: no listener allows the route",
)
SERVED = RouteState("True", "Accepted", "Gateway ns/chatfleet serves HTTPRoute bot")
PENDING = RouteState(
    "Unknown", "Pending", "No controller of Gateway ns/chatfleet has answered for HTTPRoute bot yet"
)
NO_ANALYSIS_STEPS = [
    {"weight": 20, "pauseSeconds": 10, "analysis": False},
    {"weight": 100, "pauseSeconds": 0},
]


def promoted(w: World) -> bool:
    return w.status.get("stableRevision") == "B"


def routed(**kw) -> World:
    return world(traffic=HTTPROUTE, total=4, **kw)


def test_a_refused_route_holds_the_step_and_says_the_route_is_not_served():
    w = routed(route=REFUSED)
    # ticks 1..120: the canary pod is Ready and the figures pass, but users reach no track: step 1 stays
    for _ in range(120):
        w.tick()
    assert w.phase == ReleasePhase.STEPPING and w.status["currentStepIndex"] == 0
    assert w.gate == ReleaseReason.ROUTE_NOT_SERVED and w.plans[-1].gate.kind == "paused"
    message = w.status["release"]["message"]
    assert message.startswith("Release paused at step 1/3: the canary gets no user traffic")
    assert "the route is not served (NotAllowedByListeners: Gateway ns/chatfleet does not accept" in message
    analysis = w.status["release"]["analysis"]
    assert analysis["successful"] == 0 and analysis["lastVerdict"] == INCONCLUSIVE
    assert "not a pass: the route is not served" in analysis["lastMessage"]
    # the Gateway accepts the route: the release moves on and promotes
    w.route = SERVED
    w.run_until(promoted, max_ticks=200)
    assert w.status["releaseHistory"][0]["result"] == "Promoted"


def test_the_pause_counts_only_while_the_route_is_served():
    w = routed(route=SERVED, rollout={"steps": NO_ANALYSIS_STEPS})
    w.tick()  # tick 1: the release starts
    for _ in range(5):  # ticks 2..6: the canary pod is Ready, 5 s of the 10 s pause pass
        w.tick()
    w.route = REFUSED  # tick 7..36: the Gateway refuses the route
    for _ in range(30):
        w.tick()
    assert w.status["currentStepIndex"] == 0 and w.gate == ReleaseReason.ROUTE_NOT_SERVED
    assert w.status["release"].get("canaryReadyAt") is None  # the step's clock stopped
    w.route = SERVED  # tick 37: served again -> the pause starts over: 10 s more, not 5
    n = w.run_until(lambda w: w.status["currentStepIndex"] == 1 or promoted(w))
    assert n == 11


def test_a_failing_canary_still_rolls_back_behind_a_refused_route():
    w = routed(route=REFUSED)
    w.error_rate = 4.2
    w.run_until(lambda w: w.phase == ReleasePhase.ROLLED_BACK, max_ticks=60)
    assert "error rate 4.2% > 1%" in w.plans[-1].gate.message


def test_a_route_no_gateway_answered_for_does_not_hold_the_release():
    # Unknown is not False: a route just written, or a Gateway with no controller, holds nothing
    w = routed(route=PENDING)
    w.run_until(promoted, max_ticks=200)


def test_an_inconclusive_analysis_names_a_route_no_gateway_answered_for():
    w = routed(route=PENDING)
    w.error_rate = None  # no canary traffic
    w.run_until(lambda w: w.gate == ReleaseReason.NO_TRAFFIC, max_ticks=60)
    message = w.plans[-1].gate.message
    assert (
        "the route is not known to be served yet (Pending: No controller of Gateway ns/chatfleet" in message
    )


def test_the_shadow_phase_waits_for_a_served_route():
    shadow = {"quality": {"shadow": {"enabled": True, "percent": 25, "minRequests": 1}}}
    w = routed(route=REFUSED, rollout={"analysis": shadow})
    for _ in range(60):
        w.tick()
    assert w.phase == ReleasePhase.SHADOWING and w.gate == ReleaseReason.ROUTE_NOT_SERVED
    assert w.status["release"]["message"].startswith("Release paused in the shadow phase")
    w.route = SERVED
    w.run_until(lambda w: w.phase == ReleasePhase.STEPPING, max_ticks=60)


def test_plan_pass_reads_the_observed_route_for_the_gateway_of_the_settings():
    """Through the pass's context: the HTTPRoute as the watch cache holds it, refused by the Gateway."""
    old = {"model": {"uri": "hf://org/m", "revision": "v1"}, "scaling": {"replicas": 2}}
    new = {**old, "model": {"uri": "hf://org/m", "revision": "v2"}}
    ctx = context(old, traffic="HTTPRoute")
    children = by_key(pass_children(ctx)[1])
    old_rev = ctx.update_revision
    route = copy.deepcopy(children[("HTTPRoute", "bot")])
    refused = {"type": "Accepted", "status": "False", "reason": "NoMatchingListenerHostname", "message": "no"}
    route["status"] = {"parents": [{"parentRef": {"name": "chatfleet"}, "conditions": [refused]}]}
    children[("HTTPRoute", "bot")] = route
    pods = [PodFacts(f"bot-{i}", old_rev, "stable", "Running", True) for i in range(2)]
    status = {"stableRevision": old_rev}
    plan, _ = pass_children(context(new, children=children, pods=pods, status=status, traffic="HTTPRoute"))
    assert plan.in_release and plan.gate.reason == ReleaseReason.ROUTE_NOT_SERVED
    assert (
        "NoMatchingListenerHostname: Gateway ns/chatfleet does not accept HTTPRoute bot: no"
        in plan.gate.message
    )
    # the same route refused by a Gateway the operator's routes do not name holds nothing
    settings = Settings(release=ReleaseSettings(gateway_name="other"))
    ctx = context(new, children=children, pods=pods, status=status, traffic="HTTPRoute", settings=settings)
    assert pass_children(ctx)[0].gate.reason == ReleaseReason.RELEASING


AT = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
NOT_SERVED = f"the route is not served (NotAllowedByListeners: {REFUSED.message})"
NOT_KNOWN = f"the route is not known to be served yet (Pending: {PENDING.message})"


@pytest.mark.parametrize(
    ("verdict", "route", "counted", "message"),
    [
        pytest.param(
            SUCCESSFUL, REFUSED, INCONCLUSIVE, f"figures; not a pass: {NOT_SERVED}", id="pass-is-none"
        ),
        pytest.param(
            INCONCLUSIVE, REFUSED, INCONCLUSIVE, f"figures ({NOT_SERVED})", id="no-traffic-says-why"
        ),
        pytest.param(FAILED, REFUSED, FAILED, "figures", id="failed-counts"),
        pytest.param(ERROR, REFUSED, ERROR, "figures", id="error-counts"),
        pytest.param(SUCCESSFUL, PENDING, SUCCESSFUL, "figures", id="unknown-passes"),
        pytest.param(INCONCLUSIVE, PENDING, INCONCLUSIVE, f"figures ({NOT_KNOWN})", id="unknown-says-why"),
        pytest.param(INCONCLUSIVE, SERVED, INCONCLUSIVE, "figures", id="served"),
        pytest.param(SUCCESSFUL, None, SUCCESSFUL, "figures", id="no-route"),
    ],
)
def test_route_gated(verdict, route, counted, message):
    m = route_gated(Measurement(AT, verdict, "figures"), route)
    assert (m.verdict, m.message) == (counted, message)
