"""The release planner: canary and blue-green as one pure function of (spec, old status, facts, now).

All release state lives in status (facts in status, phase derived): `status.release` holds the revision under
release, its step, when the step began, the analysis counters and the last figures; `status.releaseHistory`
the last outcomes. A restarted operator reads them and carries on from the same step: no double promotion
(promotion is idempotent: it ends when the stable Deployment runs the new revision), no lost rollback
(a rollback is written as phase RolledBack and its revision is never retried until the spec changes).

One pass, in order (`plan_release`):
  0. no release when the spec revision is the stable one (returning to the stable hash skips analysis);
  1. intents from the spec (abort, promote, paused), collected first and folded in below;
  2. health of the canary/preview pods: crash-looping, restarting, image pulls, the progress deadline --
     each rolls back at once, without waiting for metrics;
  3. the analysis measurement of this pass (if one was due), folded into the counters;
  4. one predicate, `rollback_reason`, decides a rollback from 0-3;
  5. otherwise the step machine moves: weights through the steps (canary), or preview -> switch ->
     scale-down delay (blue-green).

Rollback order (applied by the reconciler in exactly this order):
  traffic to stable (route weight 0 / active selector back) -> scale the canary down -> status Stalled
  with the reason and figures -> a Warning event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chatfleet_operator.analysis.assess import (
    ERROR_PAUSE,
    INCONCLUSIVE,
    ROLLBACK,
    SUCCESSFUL,
    Measurement,
    empty_counters,
    fold,
)
from chatfleet_operator.analysis.queries import window_seconds
from chatfleet_operator.converge.facts import IMAGE_PULL_REASONS, PodFacts
from chatfleet_operator.release.traffic import AUTO, REPLACE_IN_PLACE, SURGE, split
from chatfleet_operator.spec import ChatbotServiceSpec

# Release phases (status.release.phase).
PROGRESSING = "Progressing"  # canary steps / blue-green preview + pre-promotion analysis
PROMOTING = "Promoting"  # stable Deployment takes the new revision (canary) / preview grows to full size
SWITCHED = "Switched"  # blue-green: active Service on the new revision, old kept for scaleDownDelay
FINALIZING = "Finalizing"  # blue-green: stable Deployment takes the new revision after the delay
ROLLED_BACK = "RolledBack"
ACTIVE_PHASES = (PROGRESSING, PROMOTING, SWITCHED, FINALIZING)

# Results in status.releaseHistory.
PROMOTED, ROLLED_BACK_RESULT, SUPERSEDED, CANCELLED = "Promoted", "RolledBack", "Superseded", "Cancelled"
HISTORY_LIMIT = 10


class ReleaseReason:
    """Condition and event reasons of releases."""

    RELEASING = "Releasing"
    PAUSED = "ReleasePaused"
    NO_TRAFFIC = "AnalysisInconclusive"
    ANALYSIS_ERROR = "AnalysisError"
    WAITING_FOR_GPUS = "WaitingForGPUs"
    AWAITING_PROMOTION = "AwaitingPromotion"
    PROMOTING = "Promoting"
    ROLLED_BACK = "RolledBack"
    PROMOTED = "ReleasePromoted"
    STARTED = "ReleaseStarted"


@dataclass(frozen=True)
class ReleaseOptions:
    """The release fields of spec.rollout that spec.py does not type (yet): GitOps intents and capacity."""

    paused: bool = False
    promote: str = ""
    abort: str = ""
    gpu_capacity: str = AUTO

    @classmethod
    def from_dict(cls, rollout: Mapping[str, Any] | None) -> ReleaseOptions:
        """Parse spec.rollout.{paused,promote,abort,gpuCapacity}."""
        r = rollout or {}
        return cls(
            paused=bool(r.get("paused") or False),
            promote=str(r.get("promote") or ""),
            abort=str(r.get("abort") or ""),
            gpu_capacity=str(r.get("gpuCapacity") or AUTO),
        )

    def wants(self, intent: str, revision: str) -> bool:
        """Whether an intent field names this revision ('*' names any)."""
        return bool(intent) and intent in (revision, "*")


@dataclass(frozen=True)
class Track:
    """One Deployment as observed: its template's revision, replicas asked, pods of that revision."""

    revision: str = ""
    replicas: int = 0
    ready: int = 0
    pods: tuple[PodFacts, ...] = ()
    exists: bool = False

    @property
    def waiting_for_gpus(self) -> bool:
        """A pod of this track cannot be scheduled for lack of GPUs."""
        return any("nvidia.com/gpu" in p.unschedulable_message for p in self.pods if not p.deleting)


@dataclass(frozen=True)
class ReleaseInput:
    """What one pass observed, besides the spec and the old status."""

    spec: ChatbotServiceSpec
    options: ReleaseOptions
    update_revision: str
    total: int
    stable: Track
    canary: Track
    traffic: str
    now: datetime
    measurement: Measurement | None = None


@dataclass(frozen=True)
class Gate:
    """What the release means for conditions: kind progressing | paused | stalled | succeeded."""

    kind: str
    reason: str
    message: str


@dataclass(frozen=True)
class EventIntent:
    """An Event to post after the status write."""

    type: str
    reason: str
    message: str


@dataclass
class ReleasePlan:
    """Desired tracks and the new release status of one pass."""

    in_release: bool
    stable_from_spec: bool
    stable_replicas: int
    canary_replicas: int
    canary_weight: int = 0
    active_revision: str = ""
    release: dict[str, Any] | None = None
    history: list[dict[str, Any]] | None = None
    top: dict[str, Any] = field(default_factory=dict)
    gate: Gate | None = None
    events: list[EventIntent] = field(default_factory=list)
    requeue_after: float | None = None


def rfc3339(now: datetime) -> str:
    """Second-precision UTC timestamp."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """Parse an RFC 3339 timestamp from status (None when absent or malformed)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _since(value: Any, now: datetime) -> float:
    """Seconds since a status timestamp (0 when absent)."""
    t = parse_time(value)
    return max(0.0, (now - t).total_seconds()) if t else 0.0


def stable_revision(old_status: Mapping[str, Any], stable: Track) -> str:
    """The revision serving now: status.stableRevision, set once a revision was fully Ready.

    A Deployment that never got Ready (e.g. pinned to a GPU product that does not exist) serves nothing,
    so fixing its spec is no release: the Deployment is simply updated.
    """
    del stable
    return str(old_status.get("stableRevision") or "")


def analysis_due(
    spec: ChatbotServiceSpec, old_status: Mapping[str, Any], canary: Track, now: datetime
) -> bool:
    """Whether this pass should measure: a release is analysing, its pods are Ready, an interval passed.

    e.g. interval 10 s, last measured 9 s ago -> False; 10 s ago -> True; never measured -> True.
    The first measurement waits one rate() window (two intervals, at least 10 s) after the canary's
    first Ready pod, so the window holds only the new pods' requests -- not the last samples of a
    canary rolled back moments ago.
    """
    rel = old_status.get("release") or {}
    if rel.get("phase") not in (PROGRESSING, SWITCHED) or canary.ready < 1:
        return False
    start = parse_time(rel.get("analysisFrom"))
    if start is None or now < start:
        return False
    last = (rel.get("analysis") or {}).get("lastMeasuredAt")
    return last is None or _since(last, now) >= spec.analysis.interval_seconds - 0.5


def health_reason(spec: ChatbotServiceSpec, rel: Mapping[str, Any], canary: Track, now: datetime) -> str:
    """Why the canary/preview pods are unhealthy ('' when healthy). Rolls back without metrics.

    Crash-looping or restarting pods, image pull failures, and the progress deadline: pods not all Ready
    `progressDeadlineSeconds` after the step began (time waiting for GPUs is not counted).
    """
    pods = [p for p in canary.pods if not p.deleting and p.revision == rel.get("revision")]
    for p in sorted(pods, key=lambda p: p.name):
        if p.waiting_reason == "CrashLoopBackOff" or (p.restarts > 0 and not p.ready):
            return f"pod {p.name} is crash-looping ({p.restarts} restarts, {p.waiting_reason or 'not Ready'})"
        if p.waiting_reason in IMAGE_PULL_REASONS:
            return f"pod {p.name} cannot pull its image ({p.waiting_reason})"
    if canary.waiting_for_gpus or canary.replicas == 0:
        return ""
    deadline = spec.analysis.progress_deadline_seconds
    if canary.ready < canary.replicas and _since(rel.get("readyDeadlineFrom"), now) > deadline:
        return f"{canary.ready}/{canary.replicas} pods Ready after progressDeadlineSeconds ({deadline}s)"
    return ""


def _history(old: Mapping[str, Any], entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """History with one more entry, newest first, at most HISTORY_LIMIT."""
    return [dict(entry), *[dict(h) for h in old.get("releaseHistory") or []]][:HISTORY_LIMIT]


def _steady(
    inp: ReleaseInput, old: Mapping[str, Any], history: list[dict[str, Any]] | None = None
) -> ReleasePlan:
    """No release: the stable Deployment follows the spec, no canary."""
    return ReleasePlan(
        in_release=False,
        stable_from_spec=True,
        stable_replicas=inp.total,
        canary_replicas=0,
        active_revision=inp.update_revision,
        history=history if history is not None else list(old.get("releaseHistory") or []),
    )


def _new_release(inp: ReleaseInput, stable_rev: str) -> dict[str, Any]:
    """status.release of a release that starts now."""
    now = rfc3339(inp.now)
    return {
        "revision": inp.update_revision,
        "fromRevision": stable_rev,
        "strategy": inp.spec.rollout.strategy,
        "phase": PROGRESSING,
        "traffic": inp.traffic,
        "capacity": SURGE if inp.options.gpu_capacity == AUTO else inp.options.gpu_capacity,
        "startedAt": now,
        "stepIndex": 0,
        "stepStartedAt": now,
        "readyDeadlineFrom": now,
        "analysis": empty_counters(),
    }


def plan_release(inp: ReleaseInput, old_status: Mapping[str, Any]) -> ReleasePlan:
    """The whole release decision of one pass (see the module docstring for the order)."""
    old = old_status or {}
    stable_rev = stable_revision(old, inp.stable)
    rel: dict[str, Any] = dict(old.get("release") or {})
    target = inp.update_revision

    # 0. No release: nothing serves yet, or the spec is (back) on the stable revision.
    if not stable_rev or not inp.stable.exists or target == stable_rev:
        if rel.get("phase") in ACTIVE_PHASES and rel.get("revision") != target:
            entry = {
                "revision": rel.get("revision"),
                "result": CANCELLED,
                "at": rfc3339(inp.now),
                "message": f"spec returned to the stable revision {stable_rev}; no analysis needed",
            }
            return _steady(inp, old, _history(old, entry))
        return _steady(inp, old)

    # A rolled-back revision is not retried until the spec changes again.
    if rel.get("revision") == target and rel.get("phase") == ROLLED_BACK:
        return _rolled_back_plan(inp, old, rel, stable_rev)

    history = list(old.get("releaseHistory") or [])
    events: list[EventIntent] = []
    if rel.get("revision") != target or rel.get("phase") not in ACTIVE_PHASES:
        if rel.get("phase") in ACTIVE_PHASES:
            history = _history(
                {"releaseHistory": history},
                {
                    "revision": rel.get("revision"),
                    "result": SUPERSEDED,
                    "at": rfc3339(inp.now),
                    "message": f"superseded by revision {target}",
                },
            )
        rel = _new_release(inp, stable_rev)
        events.append(
            EventIntent(
                "Normal",
                ReleaseReason.STARTED,
                f"Started {inp.spec.rollout.strategy} release of revision {target} (stable {stable_rev})",
            )
        )
    rel["traffic"] = inp.traffic
    old = {**old, "releaseHistory": history}
    if inp.spec.rollout.strategy == "blueGreen":
        plan = _blue_green(inp, old, rel, stable_rev)
    else:
        plan = _canary(inp, old, rel, stable_rev)
    plan.events = events + plan.events
    if plan.history is None:
        plan.history = history
    return plan


# ---- shared steps ----------------------------------------------------------------------------------


def _fold_measurement(inp: ReleaseInput, rel: dict[str, Any]) -> tuple[str, str]:
    """Step 3: fold this pass's measurement into status.release.analysis; (decision, reason)."""
    if inp.measurement is None:
        return "", ""
    a = inp.spec.analysis
    folded = fold(
        rel.get("analysis"), inp.measurement, a.failure_limit, a.consecutive_error_limit, rfc3339(inp.now)
    )
    rel["analysis"] = folded.counters
    return folded.decision, folded.reason


def rollback_reason(
    inp: ReleaseInput, rel: Mapping[str, Any], health: str, decision: str, analysis_reason: str
) -> str:
    """The one predicate that decides a rollback: abort intent, unhealthy pods, or failed analysis."""
    revision = str(rel.get("revision"))
    if inp.options.wants(inp.options.abort, revision):
        return f"aborted by spec.rollout.abort={inp.options.abort}"
    if health:
        return health
    if decision == ROLLBACK:
        return analysis_reason
    return ""


def _rollback(
    inp: ReleaseInput, old: Mapping[str, Any], rel: dict[str, Any], stable_rev: str, why: str
) -> ReleasePlan:
    """Roll back now: traffic to stable, canary to zero, status Stalled with the figures, a Warning event."""
    revision = rel["revision"]
    message = f"Rolled back revision {revision} to stable {stable_rev}: {why}"
    rel.update({"phase": ROLLED_BACK, "rolledBackAt": rfc3339(inp.now), "message": message})
    history = _history(
        old, {"revision": revision, "result": ROLLED_BACK_RESULT, "at": rfc3339(inp.now), "message": why}
    )
    plan = _rolled_back_plan(inp, {**old, "releaseHistory": history}, rel, stable_rev)
    plan.events.append(EventIntent("Warning", ReleaseReason.ROLLED_BACK, message))
    return plan


def _rolled_back_plan(
    inp: ReleaseInput, old: Mapping[str, Any], rel: dict[str, Any], stable_rev: str
) -> ReleasePlan:
    """After a rollback: stable at full size on its old template, no canary, Stalled until the spec changes."""
    failed = int((rel.get("analysis") or {}).get("failed") or 0)
    return ReleasePlan(
        in_release=True,
        stable_from_spec=False,
        stable_replicas=inp.total,
        canary_replicas=0,
        canary_weight=0,
        active_revision=stable_rev,
        release=rel,
        history=list(old.get("releaseHistory") or []),
        top={"abortReason": rel.get("message", ""), "failedChecks": failed},
        gate=Gate("stalled", ReleaseReason.ROLLED_BACK, rel.get("message", "")),
    )


def _analysis_hold(rel: Mapping[str, Any], decision: str, reason: str) -> Gate | None:
    """A paused gate when the analysis cannot conclude: Prometheus erroring, or no traffic."""
    a = rel.get("analysis") or {}
    if decision == ERROR_PAUSE or (a.get("consecutiveErrors") and a.get("lastVerdict") == "Error"):
        text = reason or f"{a.get('lastMessage', '')} ({a.get('consecutiveErrors')} consecutive errors)"
        return Gate("paused", ReleaseReason.ANALYSIS_ERROR, f"Release paused: {text}")
    if a.get("lastVerdict") == INCONCLUSIVE:
        return Gate(
            "paused",
            ReleaseReason.NO_TRAFFIC,
            "Release paused: no traffic on the canary, the analysis is inconclusive (never a pass); "
            "send traffic or enable spec.analysis.probe",
        )
    return None


def _mark_analysis_start(inp: ReleaseInput, rel: dict[str, Any]) -> None:
    """Record when analysis may start: one rate() window after the first Ready canary/preview pod."""
    if not rel.get("analysisFrom"):
        window = window_seconds(inp.spec.analysis.interval_seconds)
        rel["analysisFrom"] = rfc3339(inp.now + timedelta(seconds=window))


def _passed_since(rel: Mapping[str, Any], since: Any) -> bool:
    """A Successful measurement at or after `since`."""
    a = rel.get("analysis") or {}
    last, start = parse_time(a.get("lastSuccessfulAt")), parse_time(since)
    return last is not None and (start is None or last >= start) and a.get("lastVerdict") == SUCCESSFUL


def _requeue(inp: ReleaseInput, rel: Mapping[str, Any], *candidates: float | None) -> float:
    """Seconds until the next timed event: a measurement, a pause end, a deadline (1 s .. interval)."""
    interval = float(inp.spec.analysis.interval_seconds)
    last = (rel.get("analysis") or {}).get("lastMeasuredAt")
    next_measure = interval - _since(last, inp.now) if last else 1.0
    values = [v for v in (next_measure, *candidates) if v is not None and v > 0]
    return max(1.0, min([interval, *values]))


# ---- canary ----------------------------------------------------------------------------------------


def _capacity(inp: ReleaseInput, rel: dict[str, Any]) -> str:
    """Surge or ReplaceInPlace for this pass; Auto falls back to in-place once a surge pod finds no GPU."""
    if inp.options.gpu_capacity in (SURGE, REPLACE_IN_PLACE):
        rel["capacity"] = inp.options.gpu_capacity
    elif inp.canary.waiting_for_gpus and rel.get("capacity") == SURGE:
        rel["capacity"] = REPLACE_IN_PLACE
        rel["capacityNote"] = "no spare GPU for a surge pod: replacing stable pods in place"
    return str(rel.get("capacity") or SURGE)


def _canary(inp: ReleaseInput, old: Mapping[str, Any], rel: dict[str, Any], stable_rev: str) -> ReleasePlan:
    """One pass of a canary release."""
    steps = inp.spec.rollout.canary_steps
    idx = min(int(rel.get("stepIndex") or 0), len(steps) - 1)
    revision = rel["revision"]
    capacity = _capacity(inp, rel)

    # 2-4. Health, analysis, the rollback predicate.
    health = health_reason(inp.spec, rel, inp.canary, inp.now) if rel["phase"] == PROGRESSING else ""
    decision, analysis_reason = _fold_measurement(inp, rel)
    why = rollback_reason(inp, rel, health, decision, analysis_reason)
    if why:
        return _rollback(inp, old, rel, stable_rev, why)

    # 5. Promotion intent: skip the remaining steps.
    if rel["phase"] == PROGRESSING and inp.options.wants(inp.options.promote, revision):
        rel["phase"] = PROMOTING
        rel["promotedBy"] = f"spec.rollout.promote={inp.options.promote}"

    events: list[EventIntent] = []
    gate: Gate | None = None
    weight = steps[idx].weight
    pause_left: float | None = None

    if rel["phase"] == PROGRESSING:
        step = steps[idx]
        s = split(inp.total, weight, inp.traffic, capacity)
        canary_ready = inp.canary.ready >= s.canary and inp.canary.revision == revision
        if not canary_ready:
            rel.pop("canaryReadyAt", None)
        elif not rel.get("canaryReadyAt"):
            rel["canaryReadyAt"] = rfc3339(inp.now)
        if canary_ready:
            _mark_analysis_start(inp, rel)
        waited = _since(rel.get("canaryReadyAt"), inp.now) if canary_ready else 0.0
        pause_left = step.pause_seconds - waited if canary_ready else None
        hold = _analysis_hold(rel, decision, analysis_reason)
        if inp.options.paused:
            gate = Gate(
                "paused", ReleaseReason.PAUSED, f"Release paused by spec.rollout.paused at step {idx + 1}"
            )
        elif inp.canary.waiting_for_gpus:
            gate = Gate(
                "paused",
                ReleaseReason.WAITING_FOR_GPUS,
                f"Waiting for GPUs: canary pods cannot be scheduled (gpuCapacity {capacity}); "
                "free GPUs or set spec.rollout.gpuCapacity: ReplaceInPlace",
            )
            rel["readyDeadlineFrom"] = rfc3339(inp.now)  # waiting for GPUs does not count
        elif not canary_ready:
            gate = Gate(
                "progressing",
                ReleaseReason.RELEASING,
                f"Step {idx + 1}/{len(steps)}: waiting for canary pods ({inp.canary.ready}/{s.canary} Ready)",
            )
        elif waited >= step.pause_seconds and (
            not step.analysis or _passed_since(rel, rel.get("canaryReadyAt"))
        ):
            # Step complete: next weight, or promotion after the last step.
            if idx + 1 < len(steps):
                idx += 1
                weight = steps[idx].weight
                rel.update(stepIndex=idx, stepStartedAt=rfc3339(inp.now), readyDeadlineFrom=rfc3339(inp.now))
                rel.pop("canaryReadyAt", None)
                pause_left = None
                gate = Gate(
                    "progressing", ReleaseReason.RELEASING, f"Step {idx + 1}/{len(steps)}: weight {weight}%"
                )
            else:
                rel["phase"] = PROMOTING
        elif hold is not None and step.analysis:
            gate = hold
        else:
            left = max(0, math.ceil(step.pause_seconds - waited))
            need = "a passing analysis" if step.analysis else "nothing else"
            gate = Gate(
                "progressing",
                ReleaseReason.RELEASING,
                f"Step {idx + 1}/{len(steps)}: weight {weight}%, {left}s of pause left, then {need}",
            )

    if rel["phase"] == PROMOTING:
        # Flagger's promotion: the stable Deployment takes the new template at full size while the canary
        # keeps serving; once stable runs the new revision on every replica, traffic is all stable and
        # the canary goes to zero. Idempotent, so a restart mid-promotion cannot promote twice.
        done = inp.stable.revision == revision and inp.stable.ready >= inp.total
        if done:
            message = f"Promoted revision {revision} (was {stable_rev})"
            history = _history(
                old, {"revision": revision, "result": PROMOTED, "at": rfc3339(inp.now), "message": message}
            )
            events.append(EventIntent("Normal", ReleaseReason.PROMOTED, message))
            return ReleasePlan(
                in_release=False,
                stable_from_spec=True,
                stable_replicas=inp.total,
                canary_replicas=0,
                active_revision=revision,
                release=None,
                history=history,
                top={"stableRevision": revision},
                gate=Gate("succeeded", ReleaseReason.PROMOTED, message),
                events=events,
            )
        weight = 100 if idx == len(steps) - 1 or rel.get("promotedBy") else weight
        s = split(inp.total, weight, inp.traffic, capacity)
        # In place, the canary hands its GPUs back one pod ahead of the stable pods of the new revision
        # (e.g. total 2: canary 1 while stable has 0 Ready on it, then 0), so stable can be scheduled.
        canary = max(0, inp.total - inp.stable.ready - 1) if capacity == REPLACE_IN_PLACE else s.canary
        gate = Gate(
            "progressing",
            ReleaseReason.PROMOTING,
            f"Promoting revision {revision}: stable {inp.stable.ready}/{inp.total} Ready on it",
        )
        rel["weight"] = weight
        return _canary_plan(inp, rel, stable_rev, weight, inp.total, canary, True, gate, events, 1.0)

    s = split(inp.total, weight, inp.traffic, capacity)
    stable_replicas = s.stable
    if capacity == SURGE and inp.canary.ready < s.canary:
        stable_replicas = max(s.stable, min(inp.total, inp.stable.replicas))  # surge first, then shrink
    rel["weight"] = weight
    rel["effectiveWeight"] = s.effective_weight
    return _canary_plan(
        inp,
        rel,
        stable_rev,
        weight,
        stable_replicas,
        s.canary,
        False,
        gate,
        events,
        _requeue(inp, rel, pause_left),
    )


def _canary_plan(
    inp: ReleaseInput,
    rel: dict[str, Any],
    stable_rev: str,
    weight: int,
    stable_replicas: int,
    canary_replicas: int,
    stable_from_spec: bool,
    gate: Gate | None,
    events: list[EventIntent],
    requeue: float,
) -> ReleasePlan:
    """A canary plan with the top-level status fields filled in."""
    rel["waitingForGPUs"] = inp.canary.waiting_for_gpus
    if gate is not None:
        rel["message"] = gate.message
    a = rel.get("analysis") or {}
    return ReleasePlan(
        in_release=True,
        stable_from_spec=stable_from_spec,
        stable_replicas=stable_replicas,
        canary_replicas=canary_replicas,
        canary_weight=weight,
        active_revision=stable_rev,
        release=rel,
        top={
            "canaryRevision": rel["revision"],
            "canaryWeight": weight,
            "currentStepIndex": int(rel.get("stepIndex") or 0),
            "pauseStartTime": rel.get("canaryReadyAt") or rel.get("stepStartedAt"),
            "failedChecks": int(a.get("failed") or 0),
        },
        gate=gate,
        events=events,
        requeue_after=requeue,
    )


# ---- blue-green -----------------------------------------------------------------------------------


def _blue_green(
    inp: ReleaseInput, old: Mapping[str, Any], rel: dict[str, Any], stable_rev: str
) -> ReleasePlan:
    """One pass of a blue-green release: preview, pre-promotion analysis, switch, scale-down delay."""
    bg = inp.spec.rollout
    revision = rel["revision"]
    preview = max(1, bg.blue_green_preview_replicas)
    health = health_reason(inp.spec, rel, inp.canary, inp.now) if rel["phase"] != FINALIZING else ""
    decision, analysis_reason = _fold_measurement(inp, rel)
    why = rollback_reason(inp, rel, health, decision, analysis_reason)
    if why and rel["phase"] in (PROGRESSING, PROMOTING, SWITCHED):
        return _rollback(inp, old, rel, stable_rev, why)

    events: list[EventIntent] = []
    gate: Gate | None = None
    wait: float | None = None
    if rel["phase"] == PROGRESSING:
        ready = inp.canary.revision == revision and inp.canary.ready >= preview
        if ready and not rel.get("canaryReadyAt"):
            rel["canaryReadyAt"] = rfc3339(inp.now)
        if ready:
            _mark_analysis_start(inp, rel)
        passed = _passed_since(rel, rel.get("canaryReadyAt"))
        manual = inp.options.wants(inp.options.promote, revision)
        auto_left = bg.blue_green_auto_promotion_seconds - _since(rel.get("canaryReadyAt"), inp.now)
        hold = _analysis_hold(rel, decision, analysis_reason)
        if not ready:
            gate = Gate(
                "progressing",
                ReleaseReason.RELEASING,
                f"Preview of revision {revision}: {inp.canary.ready}/{preview} pods Ready",
            )
            if inp.canary.waiting_for_gpus:
                gate = Gate(
                    "paused",
                    ReleaseReason.WAITING_FOR_GPUS,
                    "Waiting for GPUs: preview pods cannot be scheduled",
                )
                rel["readyDeadlineFrom"] = rfc3339(inp.now)
        elif manual or (
            bg.blue_green_auto_promotion and passed and auto_left <= 0 and not inp.options.paused
        ):
            rel["phase"] = PROMOTING
            rel["promotedBy"] = f"spec.rollout.promote={inp.options.promote}" if manual else "autoPromotion"
        elif hold is not None and not passed:
            gate = hold
        elif not passed:
            gate = Gate(
                "progressing", ReleaseReason.RELEASING, "Preview Ready: pre-promotion analysis running"
            )
        elif inp.options.paused or not bg.blue_green_auto_promotion:
            gate = Gate(
                "paused",
                ReleaseReason.AWAITING_PROMOTION,
                f"Preview of revision {revision} passed analysis; awaiting `kubectl chatbot promote` "
                "(or spec.rollout.promote)",
            )
        else:
            wait = auto_left
            gate = Gate("progressing", ReleaseReason.RELEASING, f"Auto-promotion in {math.ceil(auto_left)}s")
    if rel["phase"] == PROMOTING:
        # Grow the preview to full size, then switch the active Service at once.
        if inp.canary.ready >= inp.total and inp.canary.revision == revision:
            rel["phase"] = SWITCHED
            rel["switchedAt"] = rfc3339(inp.now)
            events.append(
                EventIntent(
                    "Normal", ReleaseReason.PROMOTING, f"Switched the active Service to revision {revision}"
                )
            )
        else:
            gate = Gate(
                "progressing",
                ReleaseReason.PROMOTING,
                f"Scaling the preview to full size before the switch: {inp.canary.ready}/{inp.total} Ready",
            )
    if rel["phase"] == SWITCHED:
        left = bg.blue_green_scale_down_delay_seconds - _since(rel.get("switchedAt"), inp.now)
        if left > 0:
            wait = left
            gate = Gate(
                "progressing",
                ReleaseReason.PROMOTING,
                f"Serving revision {revision}; old revision {stable_rev} kept {math.ceil(left)}s more for an instant rollback",
            )
        else:
            rel["phase"] = FINALIZING
    if rel["phase"] == FINALIZING:
        if inp.stable.revision == revision and inp.stable.ready >= inp.total:
            message = f"Promoted revision {revision} (was {stable_rev})"
            history = _history(
                old, {"revision": revision, "result": PROMOTED, "at": rfc3339(inp.now), "message": message}
            )
            return ReleasePlan(
                in_release=False,
                stable_from_spec=True,
                stable_replicas=inp.total,
                canary_replicas=0,
                active_revision=revision,
                release=None,
                history=history,
                top={"stableRevision": revision},
                gate=Gate("succeeded", ReleaseReason.PROMOTED, message),
                events=[*events, EventIntent("Normal", ReleaseReason.PROMOTED, message)],
            )
        gate = Gate(
            "progressing", ReleaseReason.PROMOTING, f"Moving the stable Deployment to revision {revision}"
        )

    switched = rel["phase"] in (SWITCHED, FINALIZING)
    canary_replicas = preview if rel["phase"] == PROGRESSING else inp.total
    if gate is not None:
        rel["message"] = gate.message
    rel["waitingForGPUs"] = inp.canary.waiting_for_gpus
    a = rel.get("analysis") or {}
    return ReleasePlan(
        in_release=True,
        stable_from_spec=rel["phase"] == FINALIZING,
        stable_replicas=inp.total,
        canary_replicas=canary_replicas,
        canary_weight=100 if switched else 0,
        active_revision=revision if switched else stable_rev,
        release=rel,
        top={
            "canaryRevision": revision,
            "canaryWeight": 100 if switched else 0,
            "failedChecks": int(a.get("failed") or 0),
        },
        gate=gate,
        events=events,
        requeue_after=_requeue(inp, rel, wait),
    )
