"""Status: conditions with Kubernetes conventions, the derived phase, and events from old -> new. Pure.

`compute_status` builds the whole new status of a pass in one place, from the facts and what the release
contributes (its fields and its gate); `lastTransitionTime` moves only when a condition's status flips,
so a pass over unchanged facts yields an identical status and no write. `phase` is derived once, last.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chatfleet_operator.api import (
    COND_DEGRADED,
    COND_READY,
    COND_RECONCILING,
    COND_ROUTE_SERVED,
    COND_SCALING_ACTIVE,
    COND_STALLED,
    COND_UPGRADE_HELD,
    Phase,
    Reason,
)
from chatfleet_operator.converge.diagnose import Problem, crashlooping
from chatfleet_operator.converge.facts import DeploymentFacts, PodFacts, get_condition
from chatfleet_operator.intents import EventIntent, Gate, GateKind, ReleaseFields
from chatfleet_operator.timefmt import rfc3339

CONDITION_ORDER = (COND_READY, COND_RECONCILING, COND_STALLED, COND_DEGRADED)


def condition(ctype: str, status: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    """A metav1.Condition without its lastTransitionTime (set by merge_conditions)."""
    return {
        "type": ctype,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """New conditions, keeping each old lastTransitionTime unless its status flipped."""
    previous = {c.get("type"): c for c in old or []}
    merged = []
    for cond in new:
        before = previous.get(cond["type"])
        if before is not None and before.get("status") == cond["status"] and before.get("lastTransitionTime"):
            ltt = before["lastTransitionTime"]
        else:
            ltt = rfc3339(now)
        merged.append({**cond, "lastTransitionTime": ltt})
    return merged


def is_true(status: Mapping[str, Any] | None, ctype: str) -> bool:
    """Whether the condition exists with status True."""
    cond = get_condition(status, ctype)
    return cond is not None and cond.get("status") == "True"


def derive_phase(status: Mapping[str, Any]) -> str:
    """Phase for printer columns: Failed > Degraded > Ready > Progressing > Pending."""
    if is_true(status, COND_STALLED):
        return Phase.FAILED
    if is_true(status, COND_DEGRADED):
        return Phase.DEGRADED
    if is_true(status, COND_READY):
        return Phase.READY
    if status.get("replicas") or is_true(status, COND_RECONCILING):
        return Phase.PROGRESSING
    return Phase.PENDING


@dataclass(frozen=True)
class Observation:
    """Everything compute_status needs from one pass."""

    generation: int
    revision: str
    desired_replicas: int
    gpus_per_replica: int
    endpoint: str
    selector: str
    deployment: DeploymentFacts | None
    pods: Sequence[PodFacts] = ()
    problems: Sequence[Problem] = ()
    standby: int = 0
    """Warm-pool replicas the stable Deployment runs beside the desired ones."""
    standby_pods: int = 0
    """Stable pods that exist labelled chatfleet.io/serving=false (standby or drained)."""
    autoscaling: Mapping[str, Any] | None = None
    """status.autoscaling (autoscale/state.py), None without spec.scaling.autoscale."""
    scaling_active: Mapping[str, Any] | None = None
    """The ScalingActive condition (without timestamp), None without spec.scaling.autoscale."""
    route_served: Mapping[str, Any] | None = None
    """The RouteServed condition (without timestamp), None where no HTTPRoute carries the traffic."""
    routing: Mapping[str, Any] | None = None
    """status.routing: the HTTPRoute's backends (Service or InferencePool) and each pool's acceptance; None
    where no HTTPRoute carries the traffic."""
    upgrade_held: Mapping[str, Any] | None = None
    """The UpgradeHeld condition (without timestamp), None unless the upgrade wave holds a new pod template
    back (wave.py)."""
    spec_fields: Mapping[str, Any] | None = None
    """The spec's revision fields as the user wrote them (model, runtime, resources, podMetadata): they
    become status.stableSpec when the spec's revision becomes the stable one."""


def _ready_and_reconciling(obs: Observation) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ready and Reconciling conditions when there is no blocking problem."""
    gen, dep = obs.generation, obs.deployment
    if dep is None:
        msg = "Creating the Deployment"
        return (
            condition(COND_READY, False, Reason.PROGRESSING, msg, gen),
            condition(COND_RECONCILING, True, Reason.PROGRESSING, msg, gen),
        )
    counts = f"{dep.available}/{obs.desired_replicas} replicas available"
    if dep.revision != obs.revision or dep.observed_generation < dep.generation or dep.updated < dep.desired:
        msg = f"Rolling out revision {obs.revision}: {dep.updated}/{dep.desired} updated, {counts}"
        ready_now = dep.available >= obs.desired_replicas and dep.revision == obs.revision and dep.rolled_out
        return (
            condition(COND_READY, ready_now, Reason.ROLLING_OUT, msg, gen),
            condition(COND_RECONCILING, True, Reason.ROLLING_OUT, msg, gen),
        )
    wanted = obs.desired_replicas + obs.standby
    serving_ready = dep.available >= obs.desired_replicas and dep.desired == wanted
    if (not dep.rolled_out and not (obs.standby and serving_ready)) or dep.desired != wanted:
        reason = Reason.SCALING if dep.replicas != wanted else Reason.WAITING_FOR_PODS
        msg = f"Waiting for pods of revision {obs.revision}: {counts}"
        return (
            condition(COND_READY, False, reason, msg, gen),
            condition(COND_RECONCILING, True, reason, msg, gen),
        )
    msg = f"Revision {obs.revision} serving: {counts}"
    return (
        condition(COND_READY, True, Reason.READY, msg, gen),
        condition(COND_RECONCILING, False, Reason.RECONCILED, msg, gen),
    )


def compute_conditions(obs: Observation) -> list[dict[str, Any]]:
    """Ready, Reconciling, Stalled, Degraded for one observation (without timestamps)."""
    gen = obs.generation
    if obs.problems:
        first = obs.problems[0]
        message = "; ".join(p.message for p in obs.problems)
        ready = condition(COND_READY, False, first.reason, message, gen)
        reconciling = condition(
            COND_RECONCILING, False, first.reason, "Waiting for the problem to be fixed", gen
        )
        stalled = condition(COND_STALLED, True, first.reason, message, gen)
    else:
        ready, reconciling = _ready_and_reconciling(obs)
        stalled = condition(COND_STALLED, False, Reason.RECONCILED, "No problem found", gen)
    looping = crashlooping(obs.pods, obs.revision)
    if looping:
        names = ", ".join(sorted(p.name for p in looping)[:3])
        detail = looping[0].waiting_message or f"{looping[0].restarts} restarts"
        degraded = condition(
            COND_DEGRADED,
            True,
            Reason.CRASH_LOOP,
            f"{len(looping)} pod(s) restarting ({names}): {detail}",
            gen,
        )
        if ready["status"] == "True":
            ready = condition(COND_READY, False, Reason.CRASH_LOOP, degraded["message"], gen)
    else:
        degraded = condition(COND_DEGRADED, False, Reason.HEALTHY, "No pod is restarting", gen)
    return [ready, reconciling, stalled, degraded]


def apply_gate(conditions: Sequence[Mapping[str, Any]], gate: Gate, generation: int) -> list[dict[str, Any]]:
    """Ready, Reconciling and Stalled as a release gate has them (Degraded kept); no timestamps.

    Stalled (rolled back): Ready=False, Reconciling=False, Stalled=True with the gate's reason. Paused or
    advancing: Reconciling=True with the gate's reason; a spec problem diagnosed this pass (Stalled=True)
    outranks the gate in Ready and Stalled, since the user must act on it. Succeeded: unchanged.
    """
    conds = {c["type"]: {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions}
    if gate.kind not in (GateKind.STALLED, GateKind.PAUSED, GateKind.ADVANCING):
        return list(conds.values())
    if gate.kind == GateKind.STALLED:
        new = [
            condition(COND_READY, False, gate.reason, gate.message, generation),
            condition(
                COND_RECONCILING,
                False,
                gate.reason,
                "Waiting for a new revision in the spec (a rolled-back revision is not retried)",
                generation,
            ),
            condition(COND_STALLED, True, gate.reason, gate.message, generation),
        ]
    elif conds.get(COND_STALLED, {}).get("status") == "True":
        new = [
            conds[COND_READY],
            condition(COND_RECONCILING, True, gate.reason, gate.message, generation),
            conds[COND_STALLED],
        ]
    else:
        new = [
            condition(COND_READY, False, gate.reason, gate.message, generation),
            condition(COND_RECONCILING, True, gate.reason, gate.message, generation),
            # Not stalled: the gate's reason with its own message, so reason and message agree
            # (an AnalysisError pause resumes by itself once Prometheus answers).
            condition(COND_STALLED, False, gate.reason, f"Not stalled: {gate.message}", generation),
        ]
    if COND_DEGRADED in conds:
        new.append(conds[COND_DEGRADED])
    return new


def compute_status(
    old: Mapping[str, Any] | None, obs: Observation, now: datetime, release: ReleaseFields | None = None
) -> dict[str, Any]:
    """The whole new status; equal to `old` when nothing changed (so the caller skips the write).

    The one writer of stableRevision: the revision a release promoted this pass, else the serving
    revision once it is Ready on every replica, else the old value; and of stableSpec, the spec fields of
    the stable revision as written (kept while it stays stable; absent when the spec that made it is not
    known: it became stable before this field existed, or the spec moved on since).
    """
    old = old or {}
    dep = obs.deployment
    computed = compute_conditions(obs)
    ready = any(c["type"] == COND_READY and c["status"] == "True" for c in computed)
    if release is not None and release.gate is not None:
        computed = apply_gate(computed, release.gate, obs.generation)
    if obs.scaling_active is not None:
        computed = [*computed, dict(obs.scaling_active)]
    if obs.route_served is not None:
        computed = [*computed, dict(obs.route_served)]
    if obs.upgrade_held is not None:
        computed = [*computed, dict(obs.upgrade_held)]
    conditions = merge_conditions(old.get("conditions") or [], computed, now)
    stable = (release.promoted if release else None) or (
        obs.revision if ready else old.get("stableRevision", "")
    )
    status: dict[str, Any] = {
        "observedGeneration": obs.generation,
        "conditions": conditions,
        "replicas": dep.replicas if dep else 0,
        "servingReplicas": max(0, (dep.replicas if dep else 0) - obs.standby_pods),
        "readyReplicas": dep.ready if dep else 0,
        "availableReplicas": dep.available if dep else 0,
        "updatedReplicas": dep.updated if dep else 0,
        "desiredReplicas": obs.desired_replicas,
        "gpus": (dep.replicas if dep else 0) * obs.gpus_per_replica,
        "endpoint": obs.endpoint,
        "selector": obs.selector,
        "updateRevision": release.update_revision if release else obs.revision,
        "canaryWeight": 0,
    }
    if stable:
        status["stableRevision"] = stable
    spec_revision = status["updateRevision"]
    if stable and stable == spec_revision and obs.spec_fields is not None:
        status["stableSpec"] = copy.deepcopy(dict(obs.spec_fields))  # never the body's own dicts
    elif stable and stable == old.get("stableRevision") and "stableSpec" in old:
        status["stableSpec"] = old["stableSpec"]
    if obs.autoscaling is not None:
        status["autoscaling"] = dict(obs.autoscaling)
    if obs.routing is not None:
        status["routing"] = dict(obs.routing)
    if release is not None:
        status.update(release.fields)
    status["phase"] = derive_phase(status)
    return status


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """JSON merge patch turning `old` into `new`; {} when equal.

    Nested objects are diffed recursively, because a merge patch merges them: a key removed from
    status.release must be sent as null, e.g. old {"release": {"a": 1, "b": 2}}, new {"release": {"a": 1}}
    -> {"release": {"b": None}}. Lists (conditions) are replaced whole.
    """
    old = old or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = status_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value or key not in old:
            patch[key] = value
    patch.update({k: None for k in old if k not in new})
    return patch


#: Longest error text put into a condition message (the first line of the error, with its type).
ERROR_MESSAGE_LIMIT = 512


def error_message(error: BaseException) -> str:
    """The error's type and first line, e.g. ValueError('bad\\nmore') -> 'ValueError: bad'."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text[:ERROR_MESSAGE_LIMIT]


def error_status(
    old: Mapping[str, Any] | None, generation: int, message: str, now: datetime
) -> dict[str, Any]:
    """The status after a pass that raised: Ready=False and Stalled=True with reason ReconcileError.

    Everything else is kept as the last good pass left it; `observedGeneration` is not advanced (the
    generation was not reconciled). Over an unchanged error the result equals `old` (no write, no event).
    Example: old Ready=True, observedGeneration 1; generation 2 raising 'ValueError: x' -> Ready=False
    (ReconcileError, 'Reconcile failed, retrying with backoff: ValueError: x'), observedGeneration 1.
    """
    old = dict(old or {})
    text = f"Reconcile failed, retrying with backoff: {message}"
    replaced = {
        COND_READY: condition(COND_READY, False, Reason.RECONCILE_ERROR, text, generation),
        COND_RECONCILING: condition(
            COND_RECONCILING, False, Reason.RECONCILE_ERROR, "Waiting for the error to be fixed", generation
        ),
        COND_STALLED: condition(COND_STALLED, True, Reason.RECONCILE_ERROR, text, generation),
    }
    kept = {c.get("type"): c for c in old.get("conditions") or []}
    wanted = [replaced.get(t) or kept.get(t) for t in CONDITION_ORDER]
    extra = [c for t, c in kept.items() if t not in CONDITION_ORDER]
    conditions = merge_conditions(old.get("conditions") or [], [c for c in wanted if c] + extra, now)
    status = {**old, "conditions": conditions}
    status["phase"] = derive_phase(status)
    return status


def refused_status(
    old: Mapping[str, Any] | None, generation: int, problems: Sequence[Problem], now: datetime
) -> dict[str, Any]:
    """The status after a pass that refused to build the spec (converge/policy.py): Ready=False,
    Reconciling=False and Stalled=True with the first problem's reason and every problem's message.

    Nothing was applied, so everything else is kept as the last pass left it (counts, release facts);
    `observedGeneration` is advanced, since the generation was judged: kstatus then reads Stalled as final.
    Over an unchanged refusal the result equals `old` (no write, no event).
    Example: old Ready=True at generation 1; generation 2 with hostPath '/etc' -> Ready=False and
    Stalled=True (HostPathNotAllowed, "spec.model.hostPath '/etc' ..."), observedGeneration 2.
    """
    old = dict(old or {})
    first, text = problems[0].reason, "; ".join(p.message for p in problems)
    replaced = {
        COND_READY: condition(COND_READY, False, first, text, generation),
        COND_RECONCILING: condition(
            COND_RECONCILING, False, first, "Waiting for a new spec or new operator settings", generation
        ),
        COND_STALLED: condition(COND_STALLED, True, first, text, generation),
    }
    kept = {c.get("type"): c for c in old.get("conditions") or []}
    wanted = [replaced.get(t) or kept.get(t) for t in CONDITION_ORDER]
    extra = [c for t, c in kept.items() if t not in CONDITION_ORDER]
    conditions = merge_conditions(old.get("conditions") or [], [c for c in wanted if c] + extra, now)
    status = {**old, "observedGeneration": generation, "conditions": conditions}
    status["phase"] = derive_phase(status)
    return status


def status_events(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[EventIntent]:
    """Events from the old -> new difference: one Warning per newly appeared problem, one event per new
    hold of the upgrade wave (nothing else).

    Problems are Stalled or Degraded True, ScalingActive False (the autoscaler cannot read its metrics)
    and RouteServed False (the Gateway refuses the HTTPRoute), each with the condition's reason: posted
    when it turns so or its reason changes, never again while it stays. UpgradeHeld True is told the same
    way: Normal for UpgradeQueued (a fleet waiting its turn), Warning for UpgradeHalted (another fleet's
    update failed).
    """
    events = []
    for ctype, problem in (
        (COND_SCALING_ACTIVE, "False"),
        (COND_ROUTE_SERVED, "False"),
        (COND_STALLED, "True"),
        (COND_DEGRADED, "True"),
        (COND_UPGRADE_HELD, "True"),
    ):
        before, after = get_condition(old, ctype) or {}, get_condition(new, ctype) or {}
        if after.get("status") != problem:
            continue
        if before.get("status") == problem and before.get("reason") == after.get("reason"):
            continue  # told when it turned so
        kind = "Normal" if after["reason"] == Reason.UPGRADE_QUEUED else "Warning"
        events.append(EventIntent(kind, after["reason"], after["message"]))
    return events


def pass_events(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], release_events: Sequence[EventIntent] = ()
) -> list[EventIntent]:
    """The events of one pass: status-derived ones, then the release's without a second of the same type and reason."""
    derived = status_events(old, new)
    seen = {(e.type, e.reason) for e in derived}
    return [*derived, *[e for e in release_events if (e.type, e.reason) not in seen]]
