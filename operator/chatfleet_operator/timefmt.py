"""Kubernetes timestamps (RFC 3339, second precision), written and read in one place (pure)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def rfc3339(now: datetime) -> str:
    """Kubernetes timestamp with second precision, e.g. 2026-11-21T10:00:00Z."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp, e.g. '2026-01-01T10:00:00Z'; None when absent, empty or malformed."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def since(value: Any, now: datetime) -> float:
    """Seconds since a timestamp (0 when absent, malformed or in the future)."""
    t = parse_time(value)
    return max(0.0, (now - t).total_seconds()) if t else 0.0
