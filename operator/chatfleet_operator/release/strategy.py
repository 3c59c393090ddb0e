"""What a release strategy is: a small protocol, the types it returns, and the steps strategies share. Pure.

A strategy (canary/, bluegreen.py) moves one release by one pass once the planner has applied the
shared steps (intents, health, the measurement, the one rollback predicate). The registry that maps
`spec.rollout.strategy` to a strategy is `planner.STRATEGIES` (kept there so imports run one way:
strategy <- canary, bluegreen <- planner). Adding a strategy: one module here, one registry line, the
enum value in spec/rollout.py and the CRD.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from chatfleet_operator.analysis.assess import ERROR_PAUSE, INCONCLUSIVE, SUCCESSFUL
from chatfleet_operator.analysis.queries import window_seconds
from chatfleet_operator.context import PassContext, route_join_seconds, route_settle_seconds
from chatfleet_operator.intents import EventIntent, Gate, GateKind, ReleaseFields
from chatfleet_operator.release.router import TrafficIntent
from chatfleet_operator.release.state import (
    HistoryEntry,
    ReleasePhase,
    ReleaseState,
    Result,
    mirror_fields,
    with_entry,
)
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef, Strategy
from chatfleet_operator.timefmt import parse_time, rfc3339, since


class ReleaseReason:
    """Condition and event reasons of releases."""

    RELEASING = "Releasing"
    PAUSED = "ReleasePaused"
    NO_TRAFFIC = "AnalysisInconclusive"
    ANALYSIS_ERROR = "AnalysisError"
    WAITING_FOR_GPUS = "WaitingForGPUs"
    AWAITING_PROMOTION = "AwaitingPromotion"
    PROMOTING = "Promoting"
    DRAINING = "DrainingDialogues"
    DRAINED = "DialoguesDrained"
    DRAIN_TIMED_OUT = "DrainTimedOut"
    ROLLED_BACK = "RolledBack"
    PROMOTED = "ReleasePromoted"
    STARTED = "ReleaseStarted"
    SHADOW_PASSED = "ShadowPassed"
    SHADOW_NEEDS_GATEWAY = "ShadowNeedsGatewayAPI"
    ROUTE_NOT_SERVED = "RouteNotServed"


@dataclass
class ReleasePlan:
    """Desired tracks and the new release state of one pass."""

    in_release: bool
    stable_from_spec: bool
    stable_replicas: int
    canary_replicas: int
    canary_weight: int = 0
    """The step's weight (status.canaryWeight)."""
    route_weight: int | None = None
    """The canary's weight in the HTTPRoute when it is less than canary_weight: the canary's pods are not
    all Ready for the step yet, and a gateway would send a share to a backend with no Ready endpoint."""
    active_revision: str = ""
    release: ReleaseState | None = None
    history: list[HistoryEntry] = field(default_factory=list)
    promoted: str | None = None
    """The revision promoted this pass (it becomes status.stableRevision)."""
    gate: Gate | None = None
    events: list[EventIntent] = field(default_factory=list)
    requeue_after: float | None = None
    strategy: Strategy = Strategy.CANARY
    stepped: bool = True
    """The strategy's `stepped` (set by planner.plan_release): which status fields the release mirrors."""

    @property
    def routed_weight(self) -> int:
        """The canary's weight in the HTTPRoute this pass."""
        return self.canary_weight if self.route_weight is None else self.route_weight

    def status_fields(self, update_revision: str) -> ReleaseFields:
        """What this plan contributes to the status of the pass (fields derived in state.mirror_fields)."""
        fields = mirror_fields(self.stepped, self.release, self.history, self.canary_weight)
        return ReleaseFields(update_revision, fields, self.gate, self.promoted)


@dataclass(frozen=True)
class Verdict:
    """The shared steps' outcome a strategy moves on: this pass's analysis decision and its reason."""

    decision: str = ""
    reason: str = ""


class ReleaseStrategy(Protocol):
    """One way to release a revision (canary steps, blue-green preview and switch).

    It owns what differs per strategy: the planning of one pass (prepare .. advance), the track the new
    revision runs on, its traffic intent (router.py builds the objects from it), and the pods the autoscaler averages over.
    """

    track: str
    """Track of the new revision: its Deployment `<name>-<track>` and Service (canary, preview)."""
    stepped: bool
    """Whether its releases move through spec.rollout.canary.steps: status.currentStepIndex and
    pauseStartTime, and the steps in `kubectl chatbot status`."""

    def starts_shadowing(self, spec: ChatbotServiceSpec) -> bool:
        """Whether a release starts in the shadow phase (mirrored requests, no user answered by it)."""

    def routes(self, traffic: str) -> bool:
        """Whether its traffic runs through an HTTPRoute in a cluster whose traffic mode is `traffic`."""

    def traffic_intent(self, ctx: PassContext, plan: ReleasePlan, serving: str) -> TrafficIntent:
        """What it wants of this pass's traffic (router.py builds the objects); `serving`: the stable
        Deployment's revision."""

    def release_selector(self, ref: ObjectRef, plan: ReleasePlan) -> str:
        """status.selector during a release: the pods that take user traffic (see children.scale_selector)."""

    def prepare(self, ctx: PassContext, rel: ReleaseState) -> None:
        """Adjust the release before the shared steps (e.g. the canary's GPU capacity)."""

    def watches_health(self, phase: ReleasePhase) -> bool:
        """Whether the new pods' health can roll the release back in this phase."""

    def may_roll_back(self, phase: ReleasePhase) -> bool:
        """Whether a rollback reason rolls back in this phase."""

    def advance(
        self,
        ctx: PassContext,
        rel: ReleaseState,
        history: list[HistoryEntry],
        verdict: Verdict,
        stable_rev: str,
    ) -> ReleasePlan:
        """Move the release by one pass (step 5 of the planner); `stable_rev` serves until it is promoted."""


# ---- steps strategies share ---------------------------------------------------------------------


def selector_text(selector: dict[str, str]) -> str:
    """A label selector as status.selector spells it. e.g. "chatfleet.io/service=bot,chatfleet.io/track=stable"."""
    return ",".join(f"{k}={v}" for k, v in selector.items())


def analysis_hold(rel: ReleaseState, verdict: Verdict) -> Gate | None:
    """A paused gate when the analysis cannot conclude: Prometheus erroring, or no traffic."""
    a = rel.analysis
    if verdict.decision == ERROR_PAUSE or (a.get("consecutiveErrors") and rel.last_verdict == "Error"):
        text = (
            verdict.reason or f"{a.get('lastMessage', '')} ({a.get('consecutiveErrors')} consecutive errors)"
        )
        return Gate(GateKind.PAUSED, ReleaseReason.ANALYSIS_ERROR, f"Release paused: {text}")
    if rel.last_verdict == INCONCLUSIVE:
        # the measurement says why (no traffic; or the golden prompts had no Ready pod to ask)
        why = a.get("lastMessage") or "no traffic on the canary in the analysis window"
        hint = "; send traffic or enable spec.analysis.probe" if "no traffic" in why else ""
        return Gate(
            GateKind.PAUSED,
            ReleaseReason.NO_TRAFFIC,
            f"Release paused: the analysis is inconclusive (never a pass): {why}{hint}",
        )
    return None


def mark_analysis_start(ctx: PassContext, rel: ReleaseState) -> None:
    """Record when analysis may start: one rate() window after the first Ready canary/preview pod."""
    if not rel.analysis_from:
        window = window_seconds(ctx.spec.analysis.interval_seconds)
        rel.analysis_from = rfc3339(ctx.now + timedelta(seconds=window))


def passed_since(rel: ReleaseState, start_value: str | None) -> bool:
    """A Successful measurement at or after `start_value`."""
    last, start = parse_time(rel.analysis.get("lastSuccessfulAt")), parse_time(start_value)
    return last is not None and (start is None or last >= start) and rel.last_verdict == SUCCESSFUL


def requeue(ctx: PassContext, rel: ReleaseState, *candidates: float | None) -> float:
    """Seconds until the next timed event: a measurement, a pause end, a deadline (1 s .. interval)."""
    interval = float(ctx.spec.analysis.interval_seconds)
    last = rel.last_measured_at
    next_measure = interval - since(last, ctx.now) if last else 1.0
    values = [v for v in (next_measure, *candidates) if v is not None and v > 0]
    return max(1.0, min([interval, *values]))


def joined_canary(ctx: PassContext) -> tuple[int, float | None]:
    """(canary pods a route may send users to, seconds until the next Ready one may): the Ready pods of the
    canary's revision that have been Ready for route_join_seconds, while the gateway reads their endpoints.

    e.g. join 3 s, 2 pods Ready 5 s and 1 s ago -> (1, 2.0); both 5 s ago -> (2, None); no route (join 0)
    -> (Ready pods, None). A Ready pod with no time of its Ready condition counts as joined.
    """
    join = route_join_seconds(ctx)
    if not join:
        return ctx.canary.ready, None
    ages = [
        since(p.ready_since, ctx.now) if p.ready_since else join
        for p in ctx.canary.pods
        if p.ready and p.revision == ctx.canary.revision
    ]
    joined = min(ctx.canary.ready, sum(1 for age in ages if age >= join))
    waiting = [join - age for age in ages if age < join]
    return joined, (min(waiting) if waiting else None)


def settling_canary(ctx: PassContext, moved_at: str | None) -> tuple[int, float | None]:
    """(canary pods kept, seconds left) while the data plane applies the route that moved traffic off them.

    e.g. settle 10 s, canary 2 pods, traffic moved 4 s ago -> (2, 6.0); 10 s ago -> (0, None); no route
    (settle 0) -> (0, None).
    """
    settle = route_settle_seconds(ctx)
    if not settle or not moved_at or ctx.canary.replicas < 1:
        return 0, None
    left = settle - since(moved_at, ctx.now)
    return (ctx.canary.replicas, left) if left > 0 else (0, None)


def promoted_plan(
    ctx: PassContext, revision: str, stable_rev: str, history: list[HistoryEntry], events: list[EventIntent]
) -> ReleasePlan:
    """The release is over: the stable Deployment runs `revision` on every replica; history and an event."""
    message = f"Promoted revision {revision} (was {stable_rev})"
    kept, left = settling_canary(ctx, rfc3339(ctx.now))
    was = ctx.old_status.get("stableSpec")
    previous = (
        {"revision": stable_rev, "spec": copy.deepcopy(dict(was))}
        if isinstance(was, Mapping) and stable_rev != revision
        else None
    )
    return ReleasePlan(
        in_release=False,
        stable_from_spec=True,
        stable_replicas=ctx.total,
        canary_replicas=kept,
        requeue_after=left,
        active_revision=revision,
        release=None,
        history=with_entry(
            history, HistoryEntry(revision, Result.PROMOTED, rfc3339(ctx.now), message, previous)
        ),
        promoted=revision,
        gate=Gate(GateKind.SUCCEEDED, ReleaseReason.PROMOTED, message),
        events=[*events, EventIntent("Normal", ReleaseReason.PROMOTED, message)],
        strategy=ctx.spec.rollout.strategy,
    )
