"""What a pass's planners tell the status and the event writer: the release's gate on the conditions,
its status fields, and the Events to post. Plain data, shared by release/ (which decides them) and
converge/status.py (which turns them into conditions and events), so neither owns the other's types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class GateKind(StrEnum):
    """What a release means for the conditions of this pass (`apply_gate`)."""

    ADVANCING = "progressing"  # Ready=False, Reconciling=True: the release is moving
    PAUSED = "paused"  # Ready=False, Reconciling=True, Stalled=False: it waits (an intent, GPUs, analysis)
    STALLED = "stalled"  # Ready=False, Stalled=True: rolled back, waiting for a new revision
    SUCCEEDED = "succeeded"  # promoted this pass: the steady-state conditions stand


@dataclass(frozen=True)
class Gate:
    """The release's word on the conditions: its kind, reason and message."""

    kind: GateKind
    reason: str
    message: str


@dataclass(frozen=True)
class ReleaseFields:
    """What a release contributes to the status of a pass (release/state.py derives `fields`)."""

    update_revision: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    """status.release, status.releaseHistory and the top-level mirror fields (canaryWeight, ...)."""
    gate: Gate | None = None
    promoted: str | None = None
    """The revision promoted this pass: it becomes status.stableRevision."""


@dataclass(frozen=True)
class EventIntent:
    """A Kubernetes Event to post on the ChatbotService (status-derived and release events alike)."""

    type: str
    reason: str
    message: str
