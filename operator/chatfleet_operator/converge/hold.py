"""When a status write may wait (pure): progress alone on the way to Ready, and a new ChatbotService's
first status while its first rollout is only on its way. Everything else (Ready flipping, a problem, a new
generation, a release step) is written at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from chatfleet_operator.api import COND_DEGRADED, COND_READY, COND_RECONCILING, COND_STALLED, Reason
from chatfleet_operator.settings import Settings

#: Status fields that only count progress towards the spec (the stable Deployment's counts).
PROGRESS_FIELDS = frozenset(
    {"replicas", "servingReplicas", "readyReplicas", "availableReplicas", "updatedReplicas", "gpus"}
)
#: Reasons of a Ready=False, Reconciling=True that is only progress (no problem, no release step).
PROGRESS_REASONS = frozenset(
    {Reason.PROGRESSING, Reason.ROLLING_OUT, Reason.SCALING, Reason.WAITING_FOR_PODS}
)


def progress_only(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether `new` differs from `old` only by progress on the way to Ready: the counts, and the reason
    and message of Ready=False / Reconciling=True staying so with a progress reason (same generation).

    e.g. "RollingOut: 0/1 updated" -> "WaitingForPods: 0/1 available", replicas 0 -> 1: True;
    Ready False -> True, a problem, a new generation, a release step, the first status ever: False.
    """
    if not old:
        return False
    for key in (set(old) | set(new)) - PROGRESS_FIELDS - {"conditions"}:
        if old.get(key) != new.get(key):
            return False
    before = {c.get("type"): c for c in old.get("conditions") or []}
    after = {c.get("type"): c for c in new.get("conditions") or []}
    if set(before) != set(after):
        return False
    for ctype, cond in after.items():
        was = before[ctype]
        if _without_time(was) == _without_time(cond):
            continue
        if ctype not in (COND_READY, COND_RECONCILING) or was.get("status") != cond.get("status"):
            return False
        if was.get("observedGeneration") != cond.get("observedGeneration"):
            return False
        if was.get("reason") not in PROGRESS_REASONS or cond.get("reason") not in PROGRESS_REASONS:
            return False
    return True


#: The conditions of a first status that says only "on its way": (status, reasons it may have).
FIRST_PROGRESS = {
    COND_READY: ("False", PROGRESS_REASONS),
    COND_RECONCILING: ("True", PROGRESS_REASONS),
    COND_STALLED: ("False", frozenset({Reason.RECONCILED})),
    COND_DEGRADED: ("False", frozenset({Reason.HEALTHY})),
}


def first_progress(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether `new` is the first status of a ChatbotService (no conditions yet: none written, or the CRD's
    default) and says only that its first rollout is on its way: Ready False and Reconciling True with a
    progress reason, no problem, no pod restarting, and no other condition (autoscaling, a route, a held
    upgrade: those are written at once).

    e.g. {} or {"phase": "Pending", "observedGeneration": 0} -> "WaitingForPods: 0/1 available": True;
    the same with Stalled=True (Unschedulable), Ready=True, or after a first status was written: False.
    """
    if (old or {}).get("conditions"):
        return False
    conds = {c.get("type"): c for c in new.get("conditions") or []}
    if set(conds) != set(FIRST_PROGRESS):
        return False
    return all(
        conds[ctype].get("status") == status and conds[ctype].get("reason") in reasons
        for ctype, (status, reasons) in FIRST_PROGRESS.items()
    )


def _without_time(cond: Mapping[str, Any]) -> dict[str, Any]:
    """A condition without its lastTransitionTime."""
    return {k: v for k, v in cond.items() if k != "lastTransitionTime"}


def progress_hold(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    last_write: datetime | None,
    now: datetime,
    settings: Settings,
    rollout_started: datetime | None = None,
) -> float:
    """Seconds the status write of `new` waits (0: write now): a new ChatbotService's first status that
    says only that its first rollout is on its way (`first_progress`), within first_status_seconds of its
    Deployment's creation (`rollout_started`); or a progress-only change within progress_status_seconds of
    this process's last status write of the object.

    e.g. written 2 s ago, RollingOut -> WaitingForPods, interval 5 -> 3.0; Ready flipped -> 0.0; the
    first status "WaitingForPods: 0/1 available", the Deployment created 30 s ago, first 120 -> 90.0.
    """
    first = settings.retry.first_status_seconds
    if rollout_started is not None and first > 0 and first_progress(old, new):
        return max(0.0, first - (now - rollout_started).total_seconds())
    interval = settings.retry.progress_status_seconds
    if last_write is None or interval <= 0 or not progress_only(old, new):
        return 0.0
    return max(0.0, interval - (now - last_write).total_seconds())
