"""The release's typed state in status: the only place the keys of status.release and releaseHistory are spelled.

Facts in status, phase derived (argo-rollouts' CalculateRolloutPhase): `status.release` holds the revision
under release, its step, when the step began, the analysis counters and the last figures;
`status.releaseHistory` the last outcomes. A restarted operator reads them back with `from_status` and
carries on from the same step. The top-level mirror fields (canaryRevision, canaryWeight,
currentStepIndex, pauseStartTime, abortReason, failedChecks) are derived from them in `mirror_fields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from chatfleet_operator.analysis.assess import counters_from_status
from chatfleet_operator.spec import Strategy

HISTORY_LIMIT = 10
E = TypeVar("E", bound=StrEnum)


class ReleasePhase(StrEnum):
    """status.release.phase: where one release stands (not status.phase, which is derived from conditions)."""

    SHADOWING = (
        "Shadowing"  # canary: live requests mirrored to it, no weight yet (spec.analysis.quality.shadow)
    )
    STEPPING = "Progressing"  # canary steps / blue-green preview + pre-promotion analysis
    DRAINING = (
        "DrainingDialogues"  # canary: new dialogues all on the new revision, pinned ones finish on stable
    )
    PROMOTING = "Promoting"  # stable Deployment takes the new revision (canary) / preview grows to full size
    SWITCHED = "Switched"  # blue-green: active Service on the new revision, old kept for scaleDownDelay
    FINALIZING = "Finalizing"  # blue-green: stable Deployment takes the new revision after the delay
    ROLLED_BACK = "RolledBack"


ACTIVE_PHASES = frozenset(
    {
        ReleasePhase.SHADOWING,
        ReleasePhase.STEPPING,
        ReleasePhase.DRAINING,
        ReleasePhase.PROMOTING,
        ReleasePhase.SWITCHED,
        ReleasePhase.FINALIZING,
    }
)


class Result(StrEnum):
    """status.releaseHistory[].result."""

    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"
    SUPERSEDED = "Superseded"
    CANCELLED = "Cancelled"


def enum_or_raw(kind: type[E], value: Any) -> E | str:
    """A status value as its enum member, or the raw string when the enum does not know it.

    status is user-editable (the status subresource), so an unknown value is kept as written, never
    raised on. e.g. enum_or_raw(Result, "Promoted") -> Result.PROMOTED; "Reverted" -> "Reverted".
    """
    text = "" if value is None else str(value)
    return kind(text) if text in set(kind) else text


def int_or_none(value: Any) -> int | None:
    """A stored integer, or None when it is absent or not one. e.g. 2 -> 2; "3" -> 3; "x" -> None; True -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


@dataclass(frozen=True)
class HistoryEntry:
    """One outcome in status.releaseHistory."""

    revision: str
    result: Result | str
    """A Result, or the raw string of a hand-edited entry (kept as written, never raised on)."""
    at: str
    message: str
    previous: Mapping[str, Any] | None = None
    """A promotion's: the revision it replaced and that revision's spec fields as the user wrote them
    ({"revision", "spec"}: status.stableSpec before it), what `kubectl chatbot undo` puts back."""

    @classmethod
    def from_status(cls, d: Any) -> HistoryEntry | None:
        """Read one stored entry (None when it is no object)."""
        if not isinstance(d, Mapping):
            return None
        previous = d.get("previous")
        return cls(
            str(d.get("revision") or ""),
            enum_or_raw(Result, d.get("result")),
            str(d.get("at") or ""),
            str(d.get("message") or ""),
            dict(previous) if isinstance(previous, Mapping) else None,
        )

    def to_status(self) -> dict[str, Any]:
        """The stored form."""
        out: dict[str, Any] = {
            "revision": self.revision,
            "result": str(self.result),
            "at": self.at,
            "message": self.message,
        }
        if self.previous is not None:
            out["previous"] = dict(self.previous)
        return out


def with_entry(history: list[HistoryEntry], entry: HistoryEntry) -> list[HistoryEntry]:
    """History with one more entry, newest first, at most HISTORY_LIMIT."""
    return [entry, *history][:HISTORY_LIMIT]


#: status.release keys -> ReleaseState attributes and the type stored, in the order they are written.
_FIELDS = (
    ("revision", "revision", str),
    ("fromRevision", "from_revision", str),
    ("origin", "origin", str),
    ("retry", "retry", str),
    ("strategy", "strategy", str),
    ("phase", "phase", str),
    ("traffic", "traffic", str),
    ("capacity", "capacity", str),
    ("capacityNote", "capacity_note", str),
    ("startedAt", "started_at", str),
    ("shadowStartedAt", "shadow_started_at", str),
    ("shadowPassedAt", "shadow_passed_at", str),
    ("stepIndex", "step_index", int),
    ("stepStartedAt", "step_started_at", str),
    ("readyDeadlineFrom", "ready_deadline_from", str),
    ("canaryReadyAt", "canary_ready_at", str),
    ("analysisFrom", "analysis_from", str),
    ("analysis", "analysis", dict),
    ("weight", "weight", int),
    ("effectiveWeight", "effective_weight", int),
    ("promotedBy", "promoted_by", str),
    ("switchedAt", "switched_at", str),
    ("drainStartedAt", "drain_started_at", str),
    ("dialogueCheckedAt", "dialogue_checked_at", str),
    ("oldRevisionRequests", "old_revision_requests", int),
    ("dialogueCheckError", "dialogue_check_error", str),
    ("dialoguesMoved", "dialogues_moved", int),
    ("rolledBackAt", "rolled_back_at", str),
    ("message", "message", str),
    ("waitingForGPUs", "waiting_for_gpus", bool),
)


def _stored(value: Any, kind: type) -> Any:
    """A stored value of the expected type, or None (as if absent) when a hand edit broke it."""
    if kind is int:
        return int_or_none(value)
    if kind is dict:
        return counters_from_status(value) if isinstance(value, Mapping) else None
    return value if isinstance(value, kind) else None


@dataclass
class ReleaseState:
    """status.release: one release in progress (or rolled back). Changed in place by one pass's planner."""

    revision: str
    from_revision: str = ""
    origin: str | None = None
    """"operator" for a release the operator's own defaults started (a new default runtime image, with the
    spec unchanged), admitted by the upgrade wave (wave.py); None for a release of a spec change."""
    retry: str | None = None
    """spec.rollout.retry as this release started: once it is rolled back, a different token starts it again."""
    strategy: str = Strategy.CANARY
    phase: ReleasePhase = ReleasePhase.STEPPING
    traffic: str = ""
    capacity: str | None = None
    capacity_note: str | None = None
    started_at: str | None = None
    shadow_started_at: str | None = None
    """When the shadow phase began (spec.analysis.quality.shadow): live requests mirrored, no weight."""
    shadow_passed_at: str | None = None
    """When it passed and the first step took its weight (None: no shadow phase, or not passed)."""
    step_index: int = 0
    step_started_at: str | None = None
    ready_deadline_from: str | None = None
    canary_ready_at: str | None = None
    analysis_from: str | None = None
    analysis: dict[str, Any] = field(default_factory=dict)
    """The analysis counters and figures, kept by analysis.assess.fold (its keys are spelled there)."""
    weight: int | None = None
    effective_weight: int | None = None
    promoted_by: str | None = None
    switched_at: str | None = None
    drain_started_at: str | None = None
    """When the old revision began serving only the dialogues pinned to it (stickyDialogues)."""
    dialogue_checked_at: str | None = None
    """When Prometheus was last asked how many requests the old revision served in the idle window."""
    old_revision_requests: int | None = None
    """That figure: requests the old revision served in the last idleSeconds (0: its dialogues ended)."""
    dialogue_check_error: str | None = None
    """Why the last check has no figure (Prometheus unreachable); None after a check that had one."""
    dialogues_moved: int | None = None
    """Requests in the idle window when maxDrainSeconds ended the drain: the dialogues that then moved."""
    rolled_back_at: str | None = None
    message: str | None = None
    waiting_for_gpus: bool | None = None

    @classmethod
    def from_status(cls, d: Mapping[str, Any] | None) -> ReleaseState | None:
        """Read status.release (None when there is none, or when its revision or phase is unreadable).

        Never raises on a hand-edited status: a field of the wrong type reads as absent.
        """
        if not isinstance(d, Mapping):
            return None
        values = {attr: v for key, attr, kind in _FIELDS if (v := _stored(d.get(key), kind)) is not None}
        if not values.get("revision") or values.get("phase") not in set(ReleasePhase):
            return None
        values["phase"] = ReleasePhase(values["phase"])
        values["step_index"] = max(0, values.get("step_index") or 0)
        return cls(**values)

    def to_status(self) -> dict[str, Any]:
        """The stored form; unset fields are left out."""
        out = {key: getattr(self, attr) for key, attr, _ in _FIELDS if getattr(self, attr) is not None}
        out["phase"] = str(self.phase)
        return out

    @property
    def failed_checks(self) -> int:
        """Failed analysis checks of this release so far."""
        return int(self.analysis.get("failed") or 0)

    @property
    def last_verdict(self) -> str | None:
        """Verdict of the last measurement (None before the first)."""
        return self.analysis.get("lastVerdict")

    @property
    def last_measured_at(self) -> str | None:
        """When the last measurement was taken."""
        return self.analysis.get("lastMeasuredAt")


@dataclass
class ReleaseStatus:
    """The release part of status: the release in progress, its history, and the revision serving now."""

    release: ReleaseState | None = None
    history: list[HistoryEntry] = field(default_factory=list)
    stable_revision: str = ""
    """status.stableRevision, set once a revision was fully Ready (read only by the planner)."""

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> ReleaseStatus:
        """Read the release part of a stored status."""
        status = status or {}
        stored = status.get("releaseHistory")
        entries = [HistoryEntry.from_status(h) for h in (stored if isinstance(stored, list) else [])]
        return cls(
            release=ReleaseState.from_status(status.get("release")),
            history=[h for h in entries if h is not None],
            stable_revision=str(status.get("stableRevision") or ""),
        )

    @property
    def phase(self) -> ReleasePhase | None:
        """Phase of the release in status (None: no release)."""
        return self.release.phase if self.release is not None else None


def mirror_fields(
    stepped: bool,
    release: ReleaseState | None,
    history: list[HistoryEntry],
    canary_weight: int,
) -> dict[str, Any]:
    """The top-level status fields a release sets, derived in this one place.

    Canary: canaryRevision, canaryWeight, currentStepIndex, pauseStartTime, failedChecks. Blue-green:
    canaryRevision, canaryWeight (100 once switched), failedChecks. Rolled back: abortReason and
    failedChecks. status.stableRevision has one writer, converge/status.py's compute_status.
    """
    out: dict[str, Any] = {"canaryWeight": canary_weight}
    if release is not None:
        if release.phase == ReleasePhase.ROLLED_BACK:
            out["abortReason"] = release.message or ""
        else:
            out["canaryRevision"] = release.revision
            if stepped:
                out["currentStepIndex"] = release.step_index
                pause_start = release.canary_ready_at or release.step_started_at
                if pause_start is not None:
                    out["pauseStartTime"] = pause_start
        out["failedChecks"] = release.failed_checks
        out["release"] = release.to_status()
    if history:
        out["releaseHistory"] = [h.to_status() for h in history]
    return out


def last_verdict(status: Mapping[str, Any] | None) -> str | None:
    """status.release.analysis.lastVerdict, also of a release in an unknown phase (None when absent)."""
    release = (status or {}).get("release")
    analysis = release.get("analysis") if isinstance(release, Mapping) else None
    verdict = analysis.get("lastVerdict") if isinstance(analysis, Mapping) else None
    return verdict if isinstance(verdict, str) else None
