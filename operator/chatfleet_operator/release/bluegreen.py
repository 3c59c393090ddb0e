"""The blue-green strategy: a preview at `previewReplicas`, pre-promotion analysis, the switch, a scale-down delay. Pure."""

from __future__ import annotations

import math

from chatfleet_operator import api
from chatfleet_operator.context import PassContext
from chatfleet_operator.intents import EventIntent, Gate, GateKind
from chatfleet_operator.release.router import TrafficIntent, service_selector
from chatfleet_operator.release.state import HistoryEntry, ReleasePhase, ReleaseState
from chatfleet_operator.release.strategy import (
    ReleasePlan,
    ReleaseReason,
    Verdict,
    analysis_hold,
    mark_analysis_start,
    passed_since,
    promoted_plan,
    requeue,
    selector_text,
)
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef, Strategy
from chatfleet_operator.timefmt import rfc3339, since


class BlueGreen:
    """spec.rollout.strategy: blueGreen."""

    track = api.TRACK_PREVIEW
    stepped = False

    def starts_shadowing(self, spec: ChatbotServiceSpec) -> bool:
        """Blue-green has no shadow phase: its preview Service is what is tried before the switch."""
        return False

    def routes(self, traffic: str) -> bool:
        """The switch is the active Service's selector, never a route."""
        return False

    def traffic_intent(self, ctx: PassContext, plan: ReleasePlan, serving: str) -> TrafficIntent:
        """The active Service on one revision (ClientIP affinity) and the preview Service on the preview track."""
        active = {api.LABEL_REVISION: plan.active_revision or serving}
        return TrafficIntent(self.track, active, affinity_seconds=ctx.spec.runtime.sessions.ttl_seconds)

    def release_selector(self, ref: ObjectRef, plan: ReleasePlan) -> str:
        """The pods of the revision the active Service selects: the preview takes no user traffic before
        the switch; after it, the old revision takes none."""
        if plan.active_revision:
            return selector_text(service_selector(ref, **{api.LABEL_REVISION: plan.active_revision}))
        return selector_text(service_selector(ref))

    def prepare(self, ctx: PassContext, rel: ReleaseState) -> None:
        """Nothing: the preview runs beside the stable pods at full size (no GPU capacity modes)."""

    def watches_health(self, phase: ReleasePhase) -> bool:
        """Until the stable Deployment moves to the new revision."""
        return phase != ReleasePhase.FINALIZING

    def may_roll_back(self, phase: ReleasePhase) -> bool:
        """Until the stable Deployment moves: the old revision is kept for an instant rollback till then."""
        return phase in (ReleasePhase.STEPPING, ReleasePhase.PROMOTING, ReleasePhase.SWITCHED)

    def advance(
        self,
        ctx: PassContext,
        rel: ReleaseState,
        history: list[HistoryEntry],
        verdict: Verdict,
        stable_rev: str,
    ) -> ReleasePlan:
        """One pass of a blue-green release: preview, pre-promotion analysis, switch, scale-down delay."""
        bg = ctx.spec.rollout
        revision = rel.revision
        preview = max(1, bg.blue_green_preview_replicas)
        events: list[EventIntent] = []
        gate: Gate | None = None
        wait: float | None = None
        if rel.phase == ReleasePhase.STEPPING:
            ready = ctx.canary.revision == revision and ctx.canary.ready >= preview
            if ready and not rel.canary_ready_at:
                rel.canary_ready_at = rfc3339(ctx.now)
            if ready:
                mark_analysis_start(ctx, rel)
            passed = passed_since(rel, rel.canary_ready_at)
            manual = bg.wants(bg.promote, revision)
            auto_left = bg.blue_green_auto_promotion_seconds - since(rel.canary_ready_at, ctx.now)
            hold = analysis_hold(rel, verdict)
            if not ready:
                gate = Gate(
                    GateKind.ADVANCING,
                    ReleaseReason.RELEASING,
                    f"Preview of revision {revision}: {ctx.canary.ready}/{preview} pods Ready",
                )
                if ctx.canary.waiting_for_gpus:
                    gate = Gate(
                        GateKind.PAUSED,
                        ReleaseReason.WAITING_FOR_GPUS,
                        "Waiting for GPUs: preview pods cannot be scheduled",
                    )
                    rel.ready_deadline_from = rfc3339(ctx.now)
            elif manual or (bg.blue_green_auto_promotion and passed and auto_left <= 0 and not bg.paused):
                rel.phase = ReleasePhase.PROMOTING
                rel.promoted_by = f"spec.rollout.promote={bg.promote}" if manual else "autoPromotion"
            elif hold is not None and not passed:
                gate = hold
            elif not passed:
                gate = Gate(
                    GateKind.ADVANCING,
                    ReleaseReason.RELEASING,
                    "Preview Ready: pre-promotion analysis running",
                )
            elif bg.paused or not bg.blue_green_auto_promotion:
                gate = Gate(
                    GateKind.PAUSED,
                    ReleaseReason.AWAITING_PROMOTION,
                    f"Preview of revision {revision} passed analysis; awaiting `kubectl chatbot promote` "
                    "(or spec.rollout.promote)",
                )
            else:
                wait = auto_left
                gate = Gate(
                    GateKind.ADVANCING, ReleaseReason.RELEASING, f"Auto-promotion in {math.ceil(auto_left)}s"
                )
        if rel.phase == ReleasePhase.PROMOTING:
            # Grow the preview to full size, then switch the active Service at once.
            if ctx.canary.ready >= ctx.total and ctx.canary.revision == revision:
                rel.phase = ReleasePhase.SWITCHED
                rel.switched_at = rfc3339(ctx.now)
                events.append(
                    EventIntent(
                        "Normal",
                        ReleaseReason.PROMOTING,
                        f"Switched the active Service to revision {revision}",
                    )
                )
            else:
                gate = Gate(
                    GateKind.ADVANCING,
                    ReleaseReason.PROMOTING,
                    f"Scaling the preview to full size before the switch: {ctx.canary.ready}/{ctx.total} Ready",
                )
        if rel.phase == ReleasePhase.SWITCHED:
            left = bg.blue_green_scale_down_delay_seconds - since(rel.switched_at, ctx.now)
            if left > 0:
                wait = left
                gate = Gate(
                    GateKind.ADVANCING,
                    ReleaseReason.PROMOTING,
                    f"Serving revision {revision}; old revision {stable_rev} kept {math.ceil(left)}s more for an instant rollback",
                )
            else:
                rel.phase = ReleasePhase.FINALIZING
        if rel.phase == ReleasePhase.FINALIZING:
            if ctx.stable.revision == revision and ctx.stable.ready >= ctx.total:
                return promoted_plan(ctx, revision, stable_rev, history, events)
            gate = Gate(
                GateKind.ADVANCING,
                ReleaseReason.PROMOTING,
                f"Moving the stable Deployment to revision {revision}",
            )

        switched = rel.phase in (ReleasePhase.SWITCHED, ReleasePhase.FINALIZING)
        if gate is not None:
            rel.message = gate.message
        rel.waiting_for_gpus = ctx.canary.waiting_for_gpus
        return ReleasePlan(
            in_release=True,
            stable_from_spec=rel.phase == ReleasePhase.FINALIZING,
            stable_replicas=ctx.total,
            canary_replicas=preview if rel.phase == ReleasePhase.STEPPING else ctx.total,
            canary_weight=100 if switched else 0,
            active_revision=revision if switched else stable_rev,
            release=rel,
            history=history,
            gate=gate,
            events=events,
            requeue_after=requeue(ctx, rel, wait),
            strategy=Strategy.BLUE_GREEN,
        )
