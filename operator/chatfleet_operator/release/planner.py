"""The release planner: one pure function of the pass's context (spec, old status, facts, now), for every
strategy.

All release state lives in status (release/state.py). A restarted operator reads it and carries on from
the same step: no double promotion (promotion is idempotent: it ends when the stable Deployment runs the
new revision), no lost rollback (a rollback is written as phase RolledBack and its revision is never
retried until the spec changes, or spec.rollout.retry names a token other than the release's own).

One pass, in order (`plan_release`):
  0. no release when the spec revision is the stable one (returning to the stable hash skips analysis);
  1. intents from the spec (abort, promote, paused) are read from spec.rollout, folded in below;
  2. health of the canary/preview pods: crash-looping, restarting, image pulls, the progress deadline --
     each rolls back at once, without waiting for metrics;
  3. the analysis measurement of this pass (if one was due), folded into the counters (never a pass
     while the Gateway refuses the canary's HTTPRoute);
  4. one predicate, `rollback_reason`, decides a rollback from 1-3;
  5. otherwise the strategy moves the release (STRATEGIES: canary/, bluegreen.py).

Rollback order (applied by the reconciler in exactly this order):
  traffic to stable (route weight 0 / active selector back) -> scale the canary down -> status Stalled
  with the reason and figures -> a Warning event.
"""

from __future__ import annotations

import copy
from datetime import datetime

from chatfleet_operator.analysis.assess import ROLLBACK, empty_counters, fold
from chatfleet_operator.context import PassContext
from chatfleet_operator.converge.facts import IMAGE_PULL_REASONS, Track
from chatfleet_operator.intents import EventIntent, Gate, GateKind
from chatfleet_operator.release.bluegreen import BlueGreen
from chatfleet_operator.release.canary.strategy import Canary
from chatfleet_operator.release.route import route_gated
from chatfleet_operator.release.state import (
    ACTIVE_PHASES,
    HistoryEntry,
    ReleasePhase,
    ReleaseState,
    ReleaseStatus,
    Result,
    with_entry,
)
from chatfleet_operator.release.strategy import (
    ReleasePlan,
    ReleaseReason,
    ReleaseStrategy,
    Verdict,
    settling_canary,
)
from chatfleet_operator.release.traffic import AUTO, SURGE
from chatfleet_operator.spec import ChatbotServiceSpec, Strategy
from chatfleet_operator.timefmt import parse_time, rfc3339, since

#: The strategies, by spec.rollout.strategy.
STRATEGIES: dict[Strategy, ReleaseStrategy] = {Strategy.CANARY: Canary(), Strategy.BLUE_GREEN: BlueGreen()}


def strategy_of(spec: ChatbotServiceSpec) -> ReleaseStrategy:
    """The strategy spec.rollout.strategy names."""
    return STRATEGIES[spec.rollout.strategy]


def stepped(strategy: str | None) -> bool:
    """Whether a release of `strategy` (status.release.strategy) moves through steps; an unknown name is
    shown as stepped, as the canary's, the default strategy."""
    known = next((s for name, s in STRATEGIES.items() if name == strategy), None)
    return known is None or known.stepped


def analysis_due(spec: ChatbotServiceSpec, rel: ReleaseState | None, canary: Track, now: datetime) -> bool:
    """Whether this pass should measure: a release is analysing, its pods are Ready, an interval passed.

    e.g. interval 10 s, last measured 9 s ago -> False; 10 s ago -> True; never measured -> True.
    The first measurement waits one rate() window (two intervals, at least 10 s) after the canary's
    first Ready pod, so the window holds only the new pods' requests -- not the last samples of a
    canary rolled back moments ago. `rel`: the release in the old status.
    """
    analysing = (ReleasePhase.SHADOWING, ReleasePhase.STEPPING, ReleasePhase.DRAINING, ReleasePhase.SWITCHED)
    if rel is None or rel.phase not in analysing or canary.ready < 1:
        return False
    start = parse_time(rel.analysis_from)
    if start is None or now < start:
        return False
    last = rel.last_measured_at
    return last is None or since(last, now) >= spec.analysis.interval_seconds - 0.5


def dialogue_check_due(spec: ChatbotServiceSpec, rel: ReleaseState | None, now: datetime) -> bool:
    """Whether this pass should ask how many requests the draining old revision served (stickyDialogues).

    e.g. phase DrainingDialogues, interval 10 s, last check 4 s ago -> False; 10 s ago or never -> True;
    any other phase -> False. `rel`: the release in the old status.
    """
    if rel is None or rel.phase != ReleasePhase.DRAINING:
        return False
    last = rel.dialogue_checked_at
    return not last or since(last, now) >= spec.analysis.interval_seconds - 0.5


def run_deadline_clock(rel: ReleaseState, canary: Track, now: datetime) -> None:
    """The progress deadline's clock (rel.ready_deadline_from): started when a step begins, stopped (cleared)
    by a pass that finds every pod of the new revision Ready, started again by the first pass that finds one
    missing -- a node lost, a pod evicted long after its step began gets progressDeadlineSeconds to come back,
    as a step's new pods do, instead of a rollback at once. Changed only at those edges (no status write a
    pass). e.g. 1/1 Ready, clock set -> cleared; 0/1 Ready, clock cleared -> now."""
    if canary.replicas <= 0:
        return
    if canary.ready >= canary.replicas:
        rel.ready_deadline_from = None
    elif rel.ready_deadline_from is None:
        rel.ready_deadline_from = rfc3339(now)


def health_reason(spec: ChatbotServiceSpec, rel: ReleaseState, canary: Track, now: datetime) -> str:
    """Why the canary/preview pods are unhealthy ('' when healthy). Rolls back without metrics.

    Crash-looping or restarting pods, image pull failures, and the progress deadline: pods not all Ready
    `progressDeadlineSeconds` after the deadline's clock started (run_deadline_clock: the step's start, or the
    pass that found a Ready pod gone); time waiting for GPUs is not counted.
    """
    pods = [p for p in canary.pods if not p.deleting and p.revision == rel.revision]
    for p in sorted(pods, key=lambda p: p.name):
        if p.waiting_reason == "CrashLoopBackOff" or (p.restarts > 0 and not p.ready):
            return f"pod {p.name} is crash-looping ({p.restarts} restarts, {p.waiting_reason or 'not Ready'})"
        if p.waiting_reason in IMAGE_PULL_REASONS:
            return f"pod {p.name} cannot pull its image ({p.waiting_reason})"
    if canary.waiting_for_gpus or canary.replicas == 0:
        return ""
    deadline = spec.analysis.progress_deadline_seconds
    if canary.ready < canary.replicas and since(rel.ready_deadline_from, now) > deadline:
        return f"{canary.ready}/{canary.replicas} pods Ready after progressDeadlineSeconds ({deadline}s)"
    return ""


def fold_measurement(ctx: PassContext, rel: ReleaseState) -> Verdict:
    """Step 3: fold this pass's measurement into status.release.analysis; the decision and its reason.

    Behind an HTTPRoute the Gateway refuses, a passing measurement counts as Inconclusive (route.route_gated):
    no user reaches the canary through it, so the figures are the probe's alone.
    """
    if ctx.measurement is None:
        return Verdict()
    a = ctx.spec.analysis
    measurement = route_gated(ctx.measurement, ctx.route)
    folded = fold(rel.analysis, measurement, a.failure_limit, a.consecutive_error_limit, rfc3339(ctx.now))
    rel.analysis = folded.counters
    return Verdict(folded.decision, folded.reason)


def rollback_reason(ctx: PassContext, rel: ReleaseState, health: str, verdict: Verdict) -> str:
    """The one predicate that decides a rollback: abort intent, unhealthy pods, or failed analysis."""
    rollout = ctx.spec.rollout
    if rollout.wants(rollout.abort, rel.revision):
        return f"aborted by spec.rollout.abort={rollout.abort}"
    if health:
        return health
    if verdict.decision == ROLLBACK:
        return verdict.reason
    return ""


def _steady(ctx: PassContext, history: list[HistoryEntry]) -> ReleasePlan:
    """No release: the stable Deployment follows the spec, no canary (but for the seconds after a
    promotion that the route takes to move: settling_canary)."""
    last = history[0] if history else None
    promoted_now = (
        last is not None and last.result == Result.PROMOTED and last.revision == ctx.update_revision
    )
    kept, left = settling_canary(ctx, last.at if promoted_now else None)
    return ReleasePlan(
        in_release=False,
        stable_from_spec=True,
        stable_replicas=ctx.total,
        canary_replicas=kept,
        requeue_after=left,
        active_revision=ctx.update_revision,
        history=history,
        strategy=ctx.spec.rollout.strategy,
    )


def _new_release(ctx: PassContext, stable_rev: str) -> ReleaseState:
    """status.release of a release that starts now."""
    now = rfc3339(ctx.now)
    capacity = ctx.spec.rollout.gpu_capacity
    shadow = strategy_of(ctx.spec).starts_shadowing(ctx.spec)
    return ReleaseState(
        revision=ctx.update_revision,
        from_revision=stable_rev,
        strategy=ctx.spec.rollout.strategy,
        phase=ReleasePhase.SHADOWING if shadow else ReleasePhase.STEPPING,
        traffic=ctx.traffic,
        capacity=SURGE if capacity == AUTO else capacity,
        started_at=now,
        shadow_started_at=now if shadow else None,
        step_index=0,
        step_started_at=now,
        ready_deadline_from=now,
        analysis=empty_counters(),
        retry=ctx.spec.rollout.retry or None,
    )


def retry_asked(spec: ChatbotServiceSpec, rel: ReleaseState) -> bool:
    """Whether spec.rollout.retry asks the rolled-back release `rel` to start again: a token other than the
    one the release started with. e.g. started with none, retry "t1" -> True; started with "t1" -> False."""
    return bool(spec.rollout.retry) and spec.rollout.retry != (rel.retry or "")


def covering_canary(ctx: PassContext) -> int:
    """Canary pods kept after a rollback until stable's Ready pods cover the total (make before break).

    At weight 100 with replica ratio (or in place) the stable track has no pods left; scaling the canary
    to 0 at once would leave nothing to serve until stable's pods load their model. So the canary keeps
    what stable lacks, and leaves as stable's pods turn Ready.
    e.g. total 2: stable Ready 0, canary 2 -> 2; stable Ready 1 -> 1; stable Ready 2 -> 0. A stable
    track at full size (HTTPRoute surge) -> 0 at once.
    """
    return max(0, min(ctx.canary.replicas, ctx.total - ctx.stable.ready))


def covering_weight(canary: int, stable_ready: int) -> int:
    """The route's canary weight while covering pods remain: their share of the serving pods.

    e.g. canary 2, stable Ready 0 -> 100; canary 1, stable Ready 1 -> 50; canary 0 -> 0.
    """
    return round(100 * canary / (canary + stable_ready)) if canary else 0


def _rolled_back_plan(
    ctx: PassContext, rel: ReleaseState, history: list[HistoryEntry], stable_rev: str
) -> ReleasePlan:
    """After a rollback: stable at full size on its old template, the canary gone once stable covers it
    (covering_canary), Stalled until the spec changes. A canary rolled back in its shadow phase never
    answered a user, and covers nothing: it goes at once, whatever stable has Ready."""
    shadow_only = rel.shadow_started_at is not None and rel.shadow_passed_at is None
    covering = 0 if shadow_only else covering_canary(ctx)
    kept, left = settling_canary(ctx, rel.rolled_back_at)
    return ReleasePlan(
        in_release=True,
        stable_from_spec=False,
        stable_replicas=ctx.total,
        canary_replicas=max(covering, kept),
        canary_weight=covering_weight(covering, ctx.stable.ready),
        requeue_after=left,
        active_revision=stable_rev,
        release=rel,
        history=history,
        gate=Gate(GateKind.STALLED, ReleaseReason.ROLLED_BACK, rel.message or ""),
        strategy=ctx.spec.rollout.strategy,
    )


def _rollback(
    ctx: PassContext, rel: ReleaseState, history: list[HistoryEntry], stable_rev: str, why: str
) -> ReleasePlan:
    """Roll back now: traffic to stable, canary to zero, status Stalled with the figures, a Warning event."""
    message = f"Rolled back revision {rel.revision} to stable {stable_rev}: {why}"
    rel.phase, rel.rolled_back_at, rel.message = ReleasePhase.ROLLED_BACK, rfc3339(ctx.now), message
    history = with_entry(history, HistoryEntry(rel.revision, Result.ROLLED_BACK, rfc3339(ctx.now), why))
    plan = _rolled_back_plan(ctx, rel, history, stable_rev)
    plan.events.append(EventIntent("Warning", ReleaseReason.ROLLED_BACK, message))
    return plan


def starts_release(plan: ReleasePlan) -> bool:
    """Whether this pass's plan starts a release (a new revision, or one superseding another)."""
    return any(e.reason == ReleaseReason.STARTED for e in plan.events)


def held_plan(ctx: PassContext) -> ReleasePlan:
    """A release held back before it starts (the upgrade wave has no place for the operator's new defaults):
    no release, the stable Deployment on its observed template at full size, the history as it was."""
    old = ctx.release_status
    plan = ReleasePlan(
        in_release=False,
        stable_from_spec=False,
        stable_replicas=ctx.total,
        canary_replicas=0,
        active_revision=old.stable_revision,
        history=list(old.history),
        strategy=ctx.spec.rollout.strategy,
    )
    plan.stepped = STRATEGIES[plan.strategy].stepped
    return plan


def plan_release(ctx: PassContext) -> ReleasePlan:
    """The whole release decision of one pass (see the module docstring for the order), from the release
    part of the old status (`ctx.release_status`, left as it is: the planner moves a copy)."""
    plan = _decide(ctx, copy.deepcopy(ctx.release_status))
    plan.stepped = STRATEGIES[plan.strategy].stepped
    return plan


def _decide(ctx: PassContext, old: ReleaseStatus) -> ReleasePlan:
    """plan_release's decision."""
    stable_rev, rel, history = old.stable_revision, old.release, old.history
    target = ctx.update_revision
    active = rel is not None and rel.phase in ACTIVE_PHASES

    # 0. No release: nothing serves yet, or the spec is (back) on the stable revision.
    if not stable_rev or not ctx.stable.exists or target == stable_rev:
        if rel is not None and active and rel.revision != target:
            message = f"spec returned to the stable revision {stable_rev}; no analysis needed"
            entry = HistoryEntry(rel.revision, Result.CANCELLED, rfc3339(ctx.now), message)
            return _steady(ctx, with_entry(history, entry))
        return _steady(ctx, history)

    # A rolled-back revision is not retried until the spec changes again, or spec.rollout.retry asks.
    rolled_back = rel is not None and rel.revision == target and rel.phase == ReleasePhase.ROLLED_BACK
    if rolled_back and not retry_asked(ctx.spec, rel):
        return _rolled_back_plan(ctx, rel, history, stable_rev)

    events: list[EventIntent] = []
    if rel is None or rel.revision != target or not active:
        if rel is not None and active:
            entry = HistoryEntry(
                rel.revision, Result.SUPERSEDED, rfc3339(ctx.now), f"superseded by revision {target}"
            )
            history = with_entry(history, entry)
        rel = _new_release(ctx, stable_rev)
        strategy_name = ctx.spec.rollout.strategy
        again = (
            f", again after its rollback (spec.rollout.retry={ctx.spec.rollout.retry})" if rolled_back else ""
        )
        events.append(
            EventIntent(
                "Normal",
                ReleaseReason.STARTED,
                f"Started {strategy_name} release of revision {target} (stable {stable_rev}){again}",
            )
        )
    rel.traffic = ctx.traffic
    strategy = strategy_of(ctx.spec)

    # 1-4. Intents, health, the measurement, the one rollback predicate.
    strategy.prepare(ctx, rel)
    health = ""
    if strategy.watches_health(rel.phase):
        run_deadline_clock(rel, ctx.canary, ctx.now)
        health = health_reason(ctx.spec, rel, ctx.canary, ctx.now)
    verdict = fold_measurement(ctx, rel)
    why = rollback_reason(ctx, rel, health, verdict)
    if why and strategy.may_roll_back(rel.phase):
        plan = _rollback(ctx, rel, history, stable_rev, why)
    else:
        # 5. The strategy moves the release.
        plan = strategy.advance(ctx, rel, history, verdict, stable_rev)
    plan.events = events + plan.events
    return plan
