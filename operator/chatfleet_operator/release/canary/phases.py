"""The phases of a canary release, one pass each: shadowing, stepping, draining pinned dialogues, promoting;
and the plan a pass of them ends with. Pure. canary/strategy.py's Canary.advance runs them in order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet_operator.context import PassContext
from chatfleet_operator.intents import EventIntent, Gate, GateKind
from chatfleet_operator.release.route import not_served
from chatfleet_operator.release.state import HistoryEntry, ReleasePhase, ReleaseState
from chatfleet_operator.release.strategy import (
    ReleasePlan,
    ReleaseReason,
    Verdict,
    analysis_hold,
    joined_canary,
    mark_analysis_start,
    passed_since,
    requeue,
)
from chatfleet_operator.release.traffic import HTTPROUTE, REPLACE_IN_PLACE, split
from chatfleet_operator.spec import CanaryStep, Strategy
from chatfleet_operator.timefmt import rfc3339, since

#: Phases in which the canary's pods are watched for health (and can roll the release back without metrics).
HEALTH_WATCHED = frozenset({ReleasePhase.SHADOWING, ReleasePhase.STEPPING, ReleasePhase.DRAINING})


@dataclass(frozen=True)
class Step:
    """Where the steps stand after this pass: the step, its weight, the gate and the pause left."""

    index: int
    weight: int
    gate: Gate | None = None
    pause_left: float | None = None


def stepping(
    ctx: PassContext, rel: ReleaseState, steps: Sequence[CanaryStep], capacity: str, verdict: Verdict
) -> Step:
    """The stepping phase's pass: wait for the step's pods and pause (and passing analysis), then the next
    step, or the phase after the last one (rel.phase moves)."""
    idx = min(rel.step_index, len(steps) - 1)
    step = steps[idx]
    weight = step.weight
    s = split(ctx.total, weight, ctx.traffic, capacity)
    # behind a route, a pod counts once the gateway has had time to read its endpoint (joined_canary)
    canary_ready = joined_canary(ctx)[0] >= s.canary and ctx.canary.revision == rel.revision
    refused = route_hold(ctx, f"at step {idx + 1}/{len(steps)}")
    # The step's clock (its pause, the analysis it needs after) runs while its pods are Ready and
    # users reach them: a route the Gateway refuses stops it, and it starts again once served.
    serving = canary_ready and refused is None
    if not serving:
        rel.canary_ready_at = None
    elif not rel.canary_ready_at:
        rel.canary_ready_at = rfc3339(ctx.now)
    if canary_ready:
        mark_analysis_start(ctx, rel)
    waited = since(rel.canary_ready_at, ctx.now) if serving else 0.0
    pause_left = step.pause_seconds - waited if serving else None
    hold = analysis_hold(rel, verdict)
    gate: Gate | None = None
    label = f"Step {idx + 1}/{len(steps)}"
    if (
        held := holding_gate(ctx, rel, capacity, refused, canary_ready, s.canary, f"at step {idx + 1}", label)
    ) is not None:
        gate = held
    elif waited >= step.pause_seconds and (not step.analysis or passed_since(rel, rel.canary_ready_at)):
        # Step complete: next weight, or promotion after the last step.
        if idx + 1 < len(steps):
            idx += 1
            weight = steps[idx].weight
            rel.step_index = idx
            rel.step_started_at = rel.ready_deadline_from = rfc3339(ctx.now)
            rel.canary_ready_at = None
            pause_left = None
            gate = Gate(
                GateKind.ADVANCING,
                ReleaseReason.RELEASING,
                f"Step {idx + 1}/{len(steps)}: weight {weight}%",
            )
        else:
            rel.phase = after_last_step(ctx, capacity)
    elif hold is not None and step.analysis:
        gate = hold
    else:
        left = max(0, math.ceil(step.pause_seconds - waited))
        # e.g. "Step 2/3: weight 50%, 8s of pause left, then a passing analysis"; a step without
        # analysis: "Step 1/3: weight 20%, 4s of pause left (no analysis at this step)"
        need = ", then a passing analysis" if step.analysis else " (no analysis at this step)"
        gate = Gate(
            GateKind.ADVANCING,
            ReleaseReason.RELEASING,
            f"Step {idx + 1}/{len(steps)}: weight {weight}%, {left}s of pause left{need}",
        )
    return Step(idx, weight, gate, pause_left)


def promoting(
    ctx: PassContext,
    rel: ReleaseState,
    stable_rev: str,
    history: list[HistoryEntry],
    events: list[EventIntent],
    weight: int,
    capacity: str,
) -> ReleasePlan:
    """Flagger's promotion: the stable Deployment takes the new template at full size while the canary
    keeps serving; once stable runs the new revision on every replica, traffic is all stable and the
    canary goes to zero (promoted_plan). Idempotent, so a restart mid-promotion cannot promote twice."""
    s = split(ctx.total, weight, ctx.traffic, capacity)
    # In place, the canary hands its GPUs back one pod ahead of the stable pods of the new revision
    # (e.g. total 2: canary 1 while stable has 0 Ready on it, then 0), so stable can be scheduled.
    canary = max(0, ctx.total - ctx.stable.ready - 1) if capacity == REPLACE_IN_PLACE else s.canary
    gate = Gate(
        GateKind.ADVANCING,
        ReleaseReason.PROMOTING,
        f"Promoting revision {rel.revision}: stable {ctx.stable.ready}/{ctx.total} Ready on it",
    )
    rel.weight = weight
    return canary_plan(
        ctx,
        rel,
        stable_rev,
        history,
        events,
        weight=weight,
        stable=ctx.total,
        canary=canary,
        gate=gate,
        requeue_after=1.0,
        stable_from_spec=True,
    )


def holding_gate(
    ctx: PassContext,
    rel: ReleaseState,
    capacity: str,
    refused: Gate | None,
    canary_ready: bool,
    wanted: int,
    where: str,
    label: str,
) -> Gate | None:
    """What holds a phase before its clock runs, in this order: spec.rollout.paused, GPUs to wait for, a
    route the Gateway refuses (`refused`), canary pods not all Ready (`wanted` of them); None: nothing.

    e.g. where "at step 2", label "Step 2/3": "Release paused by spec.rollout.paused at step 2";
    "Step 2/3: waiting for canary pods (0/1 Ready)".
    """
    if ctx.spec.rollout.paused:
        return Gate(GateKind.PAUSED, ReleaseReason.PAUSED, f"Release paused by spec.rollout.paused {where}")
    if ctx.canary.waiting_for_gpus:
        return waiting_for_gpus(ctx, rel, capacity)
    if refused is not None:
        return refused
    if not canary_ready:
        return Gate(
            GateKind.ADVANCING,
            ReleaseReason.RELEASING,
            f"{label}: waiting for canary pods ({ctx.canary.ready}/{wanted} Ready)",
        )
    return None


def route_hold(ctx: PassContext, where: str) -> Gate | None:
    """The gate while the Gateway refuses the HTTPRoute (condition RouteServed False); None while it serves
    it, has not answered yet, or no route carries the traffic.

    No user then reaches the canary through the Gateway, so the release does not move: e.g. "Release
    paused at step 1/3: the canary gets no user traffic: the route is not served (NotAllowedByListeners:
    Gateway shop/chatfleet does not accept HTTPRoute bot: ...)". It resumes when the Gateway accepts it.
    """
    route = ctx.route
    if ctx.traffic != HTTPROUTE or route is None or not route.refused:
        return None
    return Gate(
        GateKind.PAUSED,
        ReleaseReason.ROUTE_NOT_SERVED,
        f"Release paused {where}: the canary gets no user traffic: {not_served(route)}",
    )


def waiting_for_gpus(ctx: PassContext, rel: ReleaseState, capacity: str) -> Gate:
    """The gate while canary pods cannot be scheduled for lack of GPUs; the wait does not count against
    progressDeadlineSeconds (its clock restarts now)."""
    rel.ready_deadline_from = rfc3339(ctx.now)
    return Gate(
        GateKind.PAUSED,
        ReleaseReason.WAITING_FOR_GPUS,
        f"Waiting for GPUs: canary pods cannot be scheduled (gpuCapacity {capacity}); "
        "free GPUs or set spec.rollout.gpuCapacity: ReplaceInPlace",
    )


def shadow_phase(
    ctx: PassContext,
    rel: ReleaseState,
    stable_rev: str,
    history: list[HistoryEntry],
    capacity: str,
    events: list[EventIntent],
    verdict: Verdict,
) -> ReleasePlan | None:
    """One pass of the shadow phase: the plan that holds it, or None once it passed (rel.phase is Stepping).

    e.g. percent 10, total 4: one canary pod at weight 0 with 10 % of the requests mirrored to it; a
    passing analysis since that pod turned Ready -> step 1. Without Gateway API there is nothing to mirror
    on: the release waits with no canary pod, and says so.
    """
    shadow = ctx.spec.analysis.quality.shadow
    steps = ctx.spec.rollout.canary_steps
    now = rfc3339(ctx.now)
    routed = ctx.traffic == HTTPROUTE
    s = split(ctx.total, shadow.percent if routed else 0, ctx.traffic, capacity)
    # a pod counts once the gateway has had time to read its endpoint (joined_canary), as in a step
    joined, join_left = joined_canary(ctx)
    canary_ready = routed and joined >= s.canary and ctx.canary.revision == rel.revision
    refused = route_hold(ctx, "in the shadow phase")
    if not canary_ready or refused is not None:  # a refused route mirrors nothing: the phase waits
        rel.canary_ready_at = None
    elif not rel.canary_ready_at:
        rel.canary_ready_at = now
        mark_analysis_start(ctx, rel)
    hold = analysis_hold(rel, verdict)
    if not routed:
        gate = Gate(
            GateKind.PAUSED,
            ReleaseReason.SHADOW_NEEDS_GATEWAY,
            "Release waits: spec.analysis.quality.shadow mirrors requests through an HTTPRoute, and this "
            "cluster serves no Gateway API; install Gateway API or set spec.analysis.quality.shadow.enabled false",
        )
        rel.ready_deadline_from = now  # waiting for a gateway does not count against the deadline
    elif (
        held := holding_gate(
            ctx, rel, capacity, refused, canary_ready, s.canary, "in the shadow phase", "Shadow"
        )
    ) is not None:
        gate = held
    elif passed_since(rel, rel.canary_ready_at):
        first = steps[0].weight
        message = (
            f"Shadow phase of revision {rel.revision} passed ({rel.analysis.get('lastMessage') or 'analysis passed'}); "
            f"step 1/{len(steps)} takes weight {first}%"
        )
        events.append(EventIntent("Normal", ReleaseReason.SHADOW_PASSED, message))
        rel.shadow_passed_at = rel.step_started_at = rel.ready_deadline_from = now
        rel.phase, rel.step_index, rel.canary_ready_at = ReleasePhase.STEPPING, 0, None
        return None
    elif hold is not None:
        gate = hold
    else:
        gate = Gate(
            GateKind.ADVANCING,
            ReleaseReason.RELEASING,
            f"Shadow: {shadow.percent}% of requests mirrored to the canary (weight 0); waiting for a passing "
            f"analysis with at least {shadow.min_requests} compared",
        )
    rel.weight = rel.effective_weight = 0
    plan = canary_plan(
        ctx,
        rel,
        stable_rev,
        history,
        events,
        weight=0,
        stable=s.stable,
        canary=s.canary,
        gate=gate,
        requeue_after=requeue(ctx, rel, join_left),
    )
    plan.route_weight = 0
    return plan


def after_last_step(ctx: PassContext, capacity: str) -> ReleasePhase:
    """Draining when the old revision can keep serving its pinned dialogues at full weight to the canary; else Promoting.

    That needs stickyDialogues, an HTTPRoute (a header rule reaches the stable pods while the weight is
    all on the canary) and stable pods that stay at 100 % (Surge; in place they are gone by then).
    """
    if not ctx.spec.rollout.sticky.enabled or ctx.traffic != HTTPROUTE or ctx.stable.ready < 1:
        return ReleasePhase.PROMOTING
    return (
        ReleasePhase.DRAINING
        if split(ctx.total, 100, ctx.traffic, capacity).stable > 0
        else ReleasePhase.PROMOTING
    )


def drain_phase(
    ctx: PassContext,
    rel: ReleaseState,
    stable_rev: str,
    history: list[HistoryEntry],
    capacity: str,
    events: list[EventIntent],
) -> ReleasePlan | None:
    """One pass of the drain phase: the plan that holds it, or None once it is over (rel.phase is Promoting).

    e.g. idleSeconds 300, maxDrainSeconds 900: 12 stable requests in the last 300 s -> hold; a later
    check with 0 -> promote; still 3 after 900 s -> promote, 3 recorded as dialoguesMoved, a Warning.
    """
    sticky = ctx.spec.rollout.sticky
    now = rfc3339(ctx.now)
    if not rel.drain_started_at:
        rel.drain_started_at = now
        rel.old_revision_requests = rel.dialogue_checked_at = rel.dialogue_check_error = None
    check = ctx.dialogue_check
    if check is not None:
        rel.dialogue_checked_at = now
        rel.old_revision_requests = None if check.requests is None else round(check.requests)
        rel.dialogue_check_error = check.error or None
    drained_for = since(rel.drain_started_at, ctx.now)
    requests = rel.old_revision_requests
    if check is not None and requests == 0:
        message = f"Revision {stable_rev} served no request for {sticky.idle_seconds}s: its dialogues ended"
        events.append(EventIntent("Normal", ReleaseReason.DRAINED, message))
        rel.phase = ReleasePhase.PROMOTING
        return None
    if drained_for >= sticky.max_drain_seconds:
        rel.dialogues_moved = requests
        seen = "an unknown number of" if requests is None else str(requests)
        message = (
            f"maxDrainSeconds ({sticky.max_drain_seconds}s) ended the drain of revision {stable_rev} with "
            f"{seen} requests in the last {sticky.idle_seconds}s: the dialogues still open move to "
            f"revision {rel.revision}"
        )
        events.append(EventIntent("Warning", ReleaseReason.DRAIN_TIMED_OUT, message))
        rel.phase = ReleasePhase.PROMOTING
        return None
    left = sticky.max_drain_seconds - drained_for
    if requests is None:
        error = rel.dialogue_check_error
        figure = f"not measured ({error})" if error else "not measured yet"
    else:
        figure = f"{requests} requests in the last {sticky.idle_seconds}s"
    gate = Gate(
        GateKind.ADVANCING,
        ReleaseReason.DRAINING,
        f"Promotion waits for the dialogues pinned to revision {stable_rev}: {figure}; "
        f"at most {math.ceil(left)}s left (maxDrainSeconds {sticky.max_drain_seconds})",
    )
    s = split(ctx.total, 100, ctx.traffic, capacity)
    rel.weight = rel.effective_weight = 100
    interval = float(ctx.spec.analysis.interval_seconds)
    return canary_plan(
        ctx,
        rel,
        stable_rev,
        history,
        events,
        weight=100,
        stable=s.stable,
        canary=s.canary,
        gate=gate,
        requeue_after=min(interval, max(1.0, left)),
    )


def canary_plan(
    ctx: PassContext,
    rel: ReleaseState,
    stable_rev: str,
    history: list[HistoryEntry],
    events: list[EventIntent],
    *,
    weight: int,
    stable: int,
    canary: int,
    gate: Gate | None,
    requeue_after: float,
    stable_from_spec: bool = False,
) -> ReleasePlan:
    """A canary plan of a release still in progress: `weight` percent on the canary, `stable` and `canary`
    replicas, the stable Deployment on its observed template unless `stable_from_spec` (the promotion)."""
    rel.waiting_for_gpus = ctx.canary.waiting_for_gpus
    if gate is not None:
        rel.message = gate.message
    return ReleasePlan(
        in_release=True,
        stable_from_spec=stable_from_spec,
        stable_replicas=stable,
        canary_replicas=canary,
        canary_weight=weight,
        active_revision=stable_rev,
        release=rel,
        history=history,
        gate=gate,
        events=events,
        requeue_after=requeue_after,
        strategy=Strategy.CANARY,
    )
