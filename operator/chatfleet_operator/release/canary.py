"""The canary strategy: traffic weights through spec.rollout.canary.steps, then promotion. Pure.

Each step shifts `weight` percent to the canary, waits until its pods are Ready, pauses, and (when the
step asks) waits for a passing analysis; after the last step the stable Deployment takes the new
revision at full size (flagger's promotion), then the canary goes to zero.
"""

from __future__ import annotations

import math
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.httproute import build_httproute
from chatfleet_operator.builders.service import build_service
from chatfleet_operator.context import PassContext
from chatfleet_operator.converge.status import EventIntent, Gate, GateKind, rfc3339
from chatfleet_operator.release.state import HistoryEntry, ReleasePhase, ReleaseState, since
from chatfleet_operator.release.strategy import (
    ReleaseInput,
    ReleasePlan,
    ReleaseReason,
    Verdict,
    analysis_hold,
    mark_analysis_start,
    passed_since,
    promoted_plan,
    requeue,
    selector_text,
    service_selector,
    track_service,
)
from chatfleet_operator.release.traffic import HTTPROUTE, REPLACE_IN_PLACE, SURGE, split
from chatfleet_operator.spec import ObjectRef, Strategy


class Canary:
    """spec.rollout.strategy: canary."""

    track = api.TRACK_CANARY

    def traffic_objects(self, ctx: PassContext, plan: ReleasePlan, serving: str) -> list[dict[str, Any]]:
        """HTTPRoute: the weighted route and one Service per track. ReplicaRatio: one Service over both
        tracks with ClientIP affinity (the split is the ratio of Ready pods)."""
        ref = ctx.ref
        if ctx.traffic != HTTPROUTE:
            affinity = ctx.spec.runtime.sessions.ttl_seconds
            return [build_service(ref, ref.name, service_selector(ref), affinity_seconds=affinity)]
        w = plan.canary_weight if plan.in_release and plan.canary_replicas > 0 else 0
        gateway = ctx.settings.release.gateway_name
        return [
            build_httproute(ref, stable_weight=100 - w, canary_weight=w, gateway_name=gateway),
            build_service(ref, ref.name, service_selector(ref, **{api.LABEL_TRACK: api.TRACK_STABLE})),
            track_service(ref, self.track),
        ]

    def release_selector(self, ref: ObjectRef, plan: ReleasePlan) -> str:
        """Both tracks: each takes its share of the traffic."""
        return selector_text(service_selector(ref))

    def prepare(self, inp: ReleaseInput, rel: ReleaseState) -> None:
        """Surge or ReplaceInPlace for this pass; Auto falls back to in-place once a surge pod finds no GPU."""
        capacity = inp.spec.rollout.gpu_capacity
        if capacity in (SURGE, REPLACE_IN_PLACE):
            rel.capacity = capacity
        elif inp.canary.waiting_for_gpus and rel.capacity == SURGE:
            rel.capacity = REPLACE_IN_PLACE
            rel.capacity_note = "no spare GPU for a surge pod: replacing stable pods in place"

    def watches_health(self, phase: ReleasePhase) -> bool:
        """Only while stepping: once promoting, the stable Deployment's own rollout takes over."""
        return phase == ReleasePhase.STEPPING

    def may_roll_back(self, phase: ReleasePhase) -> bool:
        """In every phase of a canary release."""
        return True

    def advance(
        self,
        inp: ReleaseInput,
        rel: ReleaseState,
        history: list[HistoryEntry],
        verdict: Verdict,
        stable_rev: str,
    ) -> ReleasePlan:
        """One pass of a canary release (step 5 of the planner)."""
        steps = inp.spec.rollout.canary_steps
        rollout = inp.spec.rollout
        idx = min(rel.step_index, len(steps) - 1)
        revision = rel.revision
        capacity = rel.capacity or SURGE

        # Promotion intent: skip the remaining steps.
        if rel.phase == ReleasePhase.STEPPING and rollout.wants(rollout.promote, revision):
            rel.phase = ReleasePhase.PROMOTING
            rel.promoted_by = f"spec.rollout.promote={rollout.promote}"

        events: list[EventIntent] = []
        gate: Gate | None = None
        weight = steps[idx].weight
        pause_left: float | None = None

        if rel.phase == ReleasePhase.STEPPING:
            step = steps[idx]
            s = split(inp.total, weight, inp.traffic, capacity)
            canary_ready = inp.canary.ready >= s.canary and inp.canary.revision == revision
            if not canary_ready:
                rel.canary_ready_at = None
            elif not rel.canary_ready_at:
                rel.canary_ready_at = rfc3339(inp.now)
            if canary_ready:
                mark_analysis_start(inp, rel)
            waited = since(rel.canary_ready_at, inp.now) if canary_ready else 0.0
            pause_left = step.pause_seconds - waited if canary_ready else None
            hold = analysis_hold(rel, verdict)
            if rollout.paused:
                gate = Gate(
                    GateKind.PAUSED,
                    ReleaseReason.PAUSED,
                    f"Release paused by spec.rollout.paused at step {idx + 1}",
                )
            elif inp.canary.waiting_for_gpus:
                gate = Gate(
                    GateKind.PAUSED,
                    ReleaseReason.WAITING_FOR_GPUS,
                    f"Waiting for GPUs: canary pods cannot be scheduled (gpuCapacity {capacity}); "
                    "free GPUs or set spec.rollout.gpuCapacity: ReplaceInPlace",
                )
                rel.ready_deadline_from = rfc3339(inp.now)  # waiting for GPUs does not count
            elif not canary_ready:
                gate = Gate(
                    GateKind.ADVANCING,
                    ReleaseReason.RELEASING,
                    f"Step {idx + 1}/{len(steps)}: waiting for canary pods ({inp.canary.ready}/{s.canary} Ready)",
                )
            elif waited >= step.pause_seconds and (
                not step.analysis or passed_since(rel, rel.canary_ready_at)
            ):
                # Step complete: next weight, or promotion after the last step.
                if idx + 1 < len(steps):
                    idx += 1
                    weight = steps[idx].weight
                    rel.step_index = idx
                    rel.step_started_at = rel.ready_deadline_from = rfc3339(inp.now)
                    rel.canary_ready_at = None
                    pause_left = None
                    gate = Gate(
                        GateKind.ADVANCING,
                        ReleaseReason.RELEASING,
                        f"Step {idx + 1}/{len(steps)}: weight {weight}%",
                    )
                else:
                    rel.phase = ReleasePhase.PROMOTING
            elif hold is not None and step.analysis:
                gate = hold
            else:
                left = max(0, math.ceil(step.pause_seconds - waited))
                need = "a passing analysis" if step.analysis else "nothing else"
                gate = Gate(
                    GateKind.ADVANCING,
                    ReleaseReason.RELEASING,
                    f"Step {idx + 1}/{len(steps)}: weight {weight}%, {left}s of pause left, then {need}",
                )

        if rel.phase == ReleasePhase.PROMOTING:
            # Flagger's promotion: the stable Deployment takes the new template at full size while the canary
            # keeps serving; once stable runs the new revision on every replica, traffic is all stable and
            # the canary goes to zero. Idempotent, so a restart mid-promotion cannot promote twice.
            if inp.stable.revision == revision and inp.stable.ready >= inp.total:
                return promoted_plan(inp, revision, stable_rev, history, events)
            weight = 100 if idx == len(steps) - 1 or rel.promoted_by else weight
            s = split(inp.total, weight, inp.traffic, capacity)
            # In place, the canary hands its GPUs back one pod ahead of the stable pods of the new revision
            # (e.g. total 2: canary 1 while stable has 0 Ready on it, then 0), so stable can be scheduled.
            canary = max(0, inp.total - inp.stable.ready - 1) if capacity == REPLACE_IN_PLACE else s.canary
            gate = Gate(
                GateKind.ADVANCING,
                ReleaseReason.PROMOTING,
                f"Promoting revision {revision}: stable {inp.stable.ready}/{inp.total} Ready on it",
            )
            rel.weight = weight
            return _plan(inp, rel, stable_rev, history, weight, inp.total, canary, True, gate, events, 1.0)

        s = split(inp.total, weight, inp.traffic, capacity)
        stable_replicas = s.stable
        if capacity == SURGE and inp.canary.ready < s.canary:
            stable_replicas = max(s.stable, min(inp.total, inp.stable.replicas))  # surge first, then shrink
        rel.weight = weight
        rel.effective_weight = s.effective_weight
        return _plan(
            inp,
            rel,
            stable_rev,
            history,
            weight,
            stable_replicas,
            s.canary,
            False,
            gate,
            events,
            requeue(inp, rel, pause_left),
        )


def _plan(
    inp: ReleaseInput,
    rel: ReleaseState,
    stable_rev: str,
    history: list[HistoryEntry],
    weight: int,
    stable_replicas: int,
    canary_replicas: int,
    stable_from_spec: bool,
    gate: Gate | None,
    events: list[EventIntent],
    requeue_after: float,
) -> ReleasePlan:
    """A canary plan of a release still in progress."""
    rel.waiting_for_gpus = inp.canary.waiting_for_gpus
    if gate is not None:
        rel.message = gate.message
    return ReleasePlan(
        in_release=True,
        stable_from_spec=stable_from_spec,
        stable_replicas=stable_replicas,
        canary_replicas=canary_replicas,
        canary_weight=weight,
        active_revision=stable_rev,
        release=rel,
        history=history,
        gate=gate,
        events=events,
        requeue_after=requeue_after,
        strategy=Strategy.CANARY,
    )
