"""Model-load time per revision: the median created -> Ready of that revision's recent pods. Pure.

A pod's model load is the time from its creation to its Ready condition (the readiness probe passes once
Triton has loaded the model). Only pods that never restarted count (a restart moves lastTransitionTime).
On kwok nodes a readiness delay stands in for it (hack/chatfleet_platform/cluster/kwok-stages.yaml).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.timefmt import parse_time

#: Most recent pods (by creation) measured per revision.
RECENT = 20


def load_seconds(pods: Sequence[PodFacts], revision: str) -> tuple[float, int] | None:
    """(median created -> Ready seconds, samples) of the revision's Ready pods; None without a sample.

    e.g. pods Ready 40 s, 42 s and 60 s after creation -> (42.0, 3).
    """
    samples: list[tuple[datetime, float]] = []
    for p in pods:
        if p.revision != revision or not p.ready or p.restarts or p.deleting:
            continue
        created, ready = parse_time(p.created), parse_time(p.ready_since)
        if created is None or ready is None or ready < created:
            continue
        samples.append((created, (ready - created).total_seconds()))
    if not samples:
        return None
    recent = [s for _, s in sorted(samples, reverse=True)[:RECENT]]
    return float(statistics.median(recent)), len(recent)


def model_load_status(
    pods: Sequence[PodFacts], revisions: Sequence[str], old: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """status.autoscaling.modelLoadSeconds: the first revision (new before stable) with samples; else the old value.

    The old value is kept when no pod can be measured now (all pods gone, or none Ready yet), so the
    forecast's lead does not fall back to the margin alone between two scale-ups.
    """
    for revision in revisions:
        if not revision:
            continue
        found = load_seconds(pods, revision)
        if found is not None:
            seconds, samples = found
            return {"revision": revision, "seconds": round(seconds, 1), "samples": samples}
    return dict(old) if old else None
