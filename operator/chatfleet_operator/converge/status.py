"""Status: conditions with Kubernetes conventions, the derived phase, and events from old -> new. Pure.

`compute_status` builds the whole new status from facts; `lastTransitionTime` moves only when a
condition's status flips, so a pass over unchanged facts yields an identical status and no write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chatfleet_operator.api import (
    COND_DEGRADED,
    COND_READY,
    COND_RECONCILING,
    COND_STALLED,
    Phase,
    Reason,
)
from chatfleet_operator.converge.diagnose import Problem, crashlooping
from chatfleet_operator.converge.facts import DeploymentFacts, PodFacts

CONDITION_ORDER = (COND_READY, COND_RECONCILING, COND_STALLED, COND_DEGRADED)


def rfc3339(now: datetime) -> str:
    """Kubernetes timestamp with second precision, e.g. 2026-11-21T10:00:00Z."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


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


def get_condition(status: Mapping[str, Any] | None, ctype: str) -> Mapping[str, Any] | None:
    """The condition of that type, or None."""
    for cond in (status or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


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
    applied: bool = True


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
    if not dep.rolled_out or dep.desired != obs.desired_replicas:
        reason = Reason.SCALING if dep.replicas != obs.desired_replicas else Reason.WAITING_FOR_PODS
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


def compute_status(old: Mapping[str, Any] | None, obs: Observation, now: datetime) -> dict[str, Any]:
    """The whole new status; equal to `old` when nothing changed (so the caller skips the write)."""
    old = old or {}
    dep = obs.deployment
    conditions = merge_conditions(old.get("conditions") or [], compute_conditions(obs), now)
    ready = any(c["type"] == COND_READY and c["status"] == "True" for c in conditions)
    stable = obs.revision if ready else old.get("stableRevision", "")
    status: dict[str, Any] = {
        "observedGeneration": obs.generation,
        "conditions": conditions,
        "replicas": dep.replicas if dep else 0,
        "readyReplicas": dep.ready if dep else 0,
        "availableReplicas": dep.available if dep else 0,
        "updatedReplicas": dep.updated if dep else 0,
        "desiredReplicas": obs.desired_replicas,
        "gpus": (dep.replicas if dep else 0) * obs.gpus_per_replica,
        "endpoint": obs.endpoint,
        "selector": obs.selector,
        "updateRevision": obs.revision,
        "canaryWeight": 0,
    }
    if stable:
        status["stableRevision"] = stable
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


@dataclass(frozen=True)
class EventIntent:
    """A Kubernetes Event to post on the ChatbotService."""

    type: str
    reason: str
    message: str


def status_events(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[EventIntent]:
    """Events from the old -> new difference: one Warning per newly appeared problem (nothing else)."""
    events = []
    for ctype in (COND_STALLED, COND_DEGRADED):
        before, after = get_condition(old, ctype), get_condition(new, ctype)
        if after is None or after.get("status") != "True":
            continue
        if before is None or before.get("status") != "True" or before.get("reason") != after.get("reason"):
            events.append(EventIntent("Warning", after["reason"], after["message"]))
    return events
