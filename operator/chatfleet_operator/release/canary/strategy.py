"""The canary strategy: traffic weights through spec.rollout.canary.steps, then promotion. Pure.

Each step shifts `weight` percent to the canary, waits until its pods are Ready, pauses, and (when the
step asks) waits for a passing analysis; after the last step the stable Deployment takes the new
revision at full size (flagger's promotion), then the canary goes to zero.

With spec.rollout.stickyDialogues on an HTTPRoute, a drain phase comes between the last step and the
promotion: every new dialogue goes to the canary, while the dialogues pinned to the old revision (by the
`x-chatfleet-revision` rule) finish on the stable pods. It ends once the stable track has served no
request for idleSeconds, or after maxDrainSeconds (the dialogues still open then move, and are counted).
Only then does the stable Deployment take the new template -- re-templating it earlier would move every
pinned dialogue to the new revision mid-conversation.

With spec.analysis.quality.shadow, a shadow phase comes before the first step: the canary runs the pods
its mirrored share needs, takes weight 0, and the gateway mirrors that share of the live requests to its
shadow port (builders/httproute.py); the analysis compares its answers with stable's on the same
messages (release/measure.py). A passing analysis moves the release to step 1; a failing one rolls it
back like any other -- before the canary ever answered a user.

While the Gateway does not serve the HTTPRoute (condition RouteServed False, release/route.py), no user
reaches the canary through it: a step (or the shadow phase) waits with reason RouteNotServed, its pause
clock stopped, and resumes once the Gateway serves the route.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatfleet_operator import api
from chatfleet_operator.builders.httproute import Mirror
from chatfleet_operator.context import PassContext
from chatfleet_operator.intents import EventIntent
from chatfleet_operator.release.canary.phases import (
    Step,
    canary_plan,
    drain_phase,
    promoting,
    shadow_phase,
    stepping,
)
from chatfleet_operator.release.router import TrafficIntent, WeightedRoute, service_selector
from chatfleet_operator.release.state import HistoryEntry, ReleasePhase, ReleaseState
from chatfleet_operator.release.strategy import (
    ReleasePlan,
    Verdict,
    joined_canary,
    promoted_plan,
    requeue,
    selector_text,
)
from chatfleet_operator.release.traffic import HTTPROUTE, REPLACE_IN_PLACE, SURGE, split
from chatfleet_operator.spec import CanaryStep, ChatbotServiceSpec, ObjectRef

#: Phases in which the canary's pods are watched for health (and can roll the release back without metrics).
HEALTH_WATCHED = frozenset({ReleasePhase.SHADOWING, ReleasePhase.STEPPING, ReleasePhase.DRAINING})


class Canary:
    """spec.rollout.strategy: canary."""

    track = api.TRACK_CANARY
    stepped = True

    def starts_shadowing(self, spec: ChatbotServiceSpec) -> bool:
        """With spec.analysis.quality.shadow enabled, a canary answers mirrored requests before any user."""
        return spec.analysis.quality.shadow.enabled

    def routes(self, traffic: str) -> bool:
        """Behind Gateway API, the canary's weight is the HTTPRoute's (replica ratio otherwise)."""
        return traffic == HTTPROUTE

    def traffic_intent(self, ctx: PassContext, plan: ReleasePlan, serving: str) -> TrafficIntent:
        """HTTPRoute: a weighted route over one Service per track. ReplicaRatio: one Service over both
        tracks with ClientIP affinity (the split is the ratio of Ready pods)."""
        if ctx.traffic != HTTPROUTE:
            affinity = ctx.spec.runtime.sessions.ttl_seconds
            return TrafficIntent(self.track, affinity_seconds=affinity, track_service=False)
        w = plan.routed_weight if plan.in_release and plan.canary_replicas > 0 else 0
        route = WeightedRoute(w, pins(ctx.spec, plan), shadow_mirror(ctx, plan))
        return TrafficIntent(self.track, {api.LABEL_TRACK: api.TRACK_STABLE}, route=route)

    def release_selector(self, ref: ObjectRef, plan: ReleasePlan) -> str:
        """Both tracks: each takes its share of the traffic."""
        return selector_text(service_selector(ref))

    def prepare(self, ctx: PassContext, rel: ReleaseState) -> None:
        """Surge or ReplaceInPlace for this pass; Auto falls back to in-place once a surge pod finds no GPU."""
        capacity = ctx.spec.rollout.gpu_capacity
        if capacity in (SURGE, REPLACE_IN_PLACE):
            rel.capacity = capacity
        elif ctx.canary.waiting_for_gpus and rel.capacity == SURGE:
            rel.capacity = REPLACE_IN_PLACE
            rel.capacity_note = "no spare GPU for a surge pod: replacing stable pods in place"

    def watches_health(self, phase: ReleasePhase) -> bool:
        """While stepping and draining: once promoting, the stable Deployment's own rollout takes over."""
        return phase in HEALTH_WATCHED

    def may_roll_back(self, phase: ReleasePhase) -> bool:
        """In every phase of a canary release."""
        return True

    def advance(
        self,
        ctx: PassContext,
        rel: ReleaseState,
        history: list[HistoryEntry],
        verdict: Verdict,
        stable_rev: str,
    ) -> ReleasePlan:
        """One pass of a canary release (step 5 of the planner): the shadow phase, the steps, the drain of
        pinned dialogues and the promotion, each ending the pass with its plan or handing on to the next."""
        steps = ctx.spec.rollout.canary_steps
        rollout = ctx.spec.rollout
        capacity = rel.capacity or SURGE

        # Promotion intent: skip the remaining steps (and the drain of pinned dialogues).
        if rel.phase in HEALTH_WATCHED and rollout.wants(rollout.promote, rel.revision):
            rel.phase = ReleasePhase.PROMOTING
            rel.promoted_by = f"spec.rollout.promote={rollout.promote}"

        events: list[EventIntent] = []
        if rel.phase == ReleasePhase.SHADOWING:
            plan = shadow_phase(ctx, rel, stable_rev, history, capacity, events, verdict)
            if plan is not None:
                return plan

        step = Step(min(rel.step_index, len(steps) - 1), steps[min(rel.step_index, len(steps) - 1)].weight)
        if rel.phase == ReleasePhase.STEPPING:
            step = stepping(ctx, rel, steps, capacity, verdict)

        if rel.phase == ReleasePhase.DRAINING:
            plan = drain_phase(ctx, rel, stable_rev, history, capacity, events)
            if plan is not None:
                return plan

        if rel.phase == ReleasePhase.PROMOTING:
            promoted = ctx.stable.revision == rel.revision and ctx.stable.ready >= ctx.total
            if promoted:
                return promoted_plan(ctx, rel.revision, stable_rev, history, events)
            last = step.index == len(steps) - 1 or bool(rel.promoted_by)
            return promoting(ctx, rel, stable_rev, history, events, 100 if last else step.weight, capacity)

        s = split(ctx.total, step.weight, ctx.traffic, capacity)
        stable_replicas = s.stable
        if capacity == SURGE and ctx.canary.ready < s.canary:
            stable_replicas = max(s.stable, min(ctx.total, ctx.stable.replicas))  # surge first, then shrink
        route_weight: int | None = None
        joined, join_left = joined_canary(ctx)
        if ctx.traffic == HTTPROUTE and not (joined >= s.canary and ctx.canary.revision == rel.revision):
            # the step waits for its pods, and for the gateway to have read their endpoints
            route_weight = covered_weight(ctx, steps, step.index, rel.revision, capacity, joined)
        rel.weight = step.weight
        rel.effective_weight = s.effective_weight if route_weight is None else route_weight
        plan = canary_plan(
            ctx,
            rel,
            stable_rev,
            history,
            events,
            weight=step.weight,
            stable=stable_replicas,
            canary=s.canary,
            gate=step.gate,
            requeue_after=requeue(ctx, rel, step.pause_left, join_left),
        )
        plan.route_weight = route_weight
        return plan


def shadow_mirror(ctx: PassContext, plan: ReleasePlan) -> Mirror | None:
    """The mirror of a release in its shadow phase once a canary pod of its revision is Ready and the
    gateway has had time to read its endpoint (joined_canary); None otherwise.

    Not before: a gateway may treat a mirror Service without endpoints as broken and fail the whole rule
    (Traefik's TraefikService does, unless allowEmptyServices), and users' requests go through that rule.
    """
    rel = plan.release
    if rel is None or rel.phase != ReleasePhase.SHADOWING or plan.canary_replicas < 1:
        return None
    if joined_canary(ctx)[0] < 1 or ctx.canary.revision != rel.revision:
        return None
    return Mirror(ctx.spec.analysis.quality.shadow.percent, ctx.settings.release.gateway_mirror)


def covered_weight(
    ctx: PassContext, steps: Sequence[CanaryStep], idx: int, revision: str, capacity: str, joined: int
) -> int:
    """The largest weight up to step idx that the canary's `joined` pods of `revision` can serve, else 0.

    Behind an HTTPRoute a step's weight waits for the step's canary pods: a gateway sends a backend its
    share whether or not it has a Ready endpoint. e.g. total 4, steps 20/50: step 2 with 1 of 2 canary pods
    joined -> 20; step 1 with 0 joined (the release just began, or its pod was lost) -> 0.
    """
    if ctx.canary.revision != revision:
        return 0
    for step in reversed(steps[:idx]):
        if joined >= split(ctx.total, step.weight, ctx.traffic, capacity).canary:
            return step.weight
    return 0


def pins(spec: ChatbotServiceSpec, plan: ReleasePlan) -> dict[str, str]:
    """Revision -> track of the HTTPRoute's pinned rules: each track whose pods all run one revision.

    e.g. stepping from a1 to b2 -> {a1: stable, b2: canary}; draining -> the same; promoting (the stable
    Deployment rolls to b2, its pods mixed) -> {b2: canary}; promoted or no release -> {b2: stable};
    rolled back -> {a1: stable}. Empty without spec.rollout.stickyDialogues.
    """
    if not spec.rollout.sticky.enabled:
        return {}
    if not plan.in_release:
        return {plan.active_revision: api.TRACK_STABLE} if plan.active_revision else {}
    out: dict[str, str] = {}
    if not plan.stable_from_spec and plan.active_revision:
        out[plan.active_revision] = api.TRACK_STABLE
    rel = plan.release
    # a canary in its shadow phase answers no user: no rule may reach it
    unpinned = (ReleasePhase.ROLLED_BACK, ReleasePhase.SHADOWING)
    if rel is not None and rel.phase not in unpinned and plan.canary_replicas > 0:
        out[rel.revision] = api.TRACK_CANARY
    return out
