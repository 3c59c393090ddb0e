"""Traffic split arithmetic of a canary: replicas per track for a weight. Pure.

Two ways to split (status.release.traffic says which is in effect):
- HTTPRoute: the Gateway API route carries exact weights; the canary gets ceil(total * w / 100) pods.
- ReplicaRatio: one Service selects both tracks, so the split is the ratio of Ready pods.

Behind the HTTPRoute, the backends are Services or, where the cluster serves the Gateway API Inference
Extension, InferencePools whose endpoint picker keeps dialogues on their replica and revision.

Two ways to find GPUs for the canary (spec.rollout.gpuCapacity):
- Surge: extra pods (argo-rollouts' CalculateReplicaCountsForBasicCanary ceilings);
- ReplaceInPlace: canary pods take stable pods' GPUs, stable + canary == total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HTTPROUTE, REPLICA_RATIO = "HTTPRoute", "ReplicaRatio"
#: What the HTTPRoute's backends are (status.routing.backends): Services, or InferencePools with the
#: endpoint picker (builders/inferencepool.py) where the cluster serves the Inference Extension.
SERVICE_BACKENDS, POOL_BACKENDS = "Service", "InferencePool"
#: --routing: auto (pools where served) or Service (never pools).
ROUTINGS = ("auto", SERVICE_BACKENDS)
SURGE, REPLACE_IN_PLACE, AUTO = "Surge", "ReplaceInPlace", "Auto"


@dataclass(frozen=True)
class Split:
    """Replicas of each track and the traffic percent the canary actually gets."""

    stable: int
    canary: int
    effective_weight: int


def canary_replicas(total: int, weight: int) -> int:
    """ceil(total * weight / 100), at least 1 for any weight > 0.

    >>> [canary_replicas(4, w) for w in (0, 10, 25, 50, 100)]
    [0, 1, 1, 2, 4]
    """
    if weight <= 0 or total <= 0:
        return 0
    return max(1, math.ceil(total * weight / 100))


def split(total: int, weight: int, traffic: str, capacity: str) -> Split:
    """Replicas per track for `weight` percent on the canary.

    Worked examples (total, weight, traffic, capacity -> stable, canary, effective weight):
      4, 10, ReplicaRatio, Surge           -> 4, 1, 20   (argo: stable ceil(4*0.9)=4, canary ceil(0.4)=1)
      4, 50, ReplicaRatio, Surge           -> 2, 2, 50
      4, 50, HTTPRoute,    Surge           -> 4, 2, 50   (the route holds the weight; stable stays full)
      4, 10, ReplicaRatio, ReplaceInPlace  -> 3, 1, 25   (no extra GPU: one stable pod gives its GPUs)
      1, 10, ReplicaRatio, ReplaceInPlace  -> 0, 1, 100  (one replica cannot be split in place)
      3, 100, ReplicaRatio, any            -> 0, 3, 100
      3, 100, HTTPRoute,   Surge           -> 3, 3, 100  (stable kept for an instant rollback)
    """
    if weight <= 0:
        return Split(total, 0, 0)
    canary = canary_replicas(total, weight)
    if weight >= 100:
        return Split(total if (traffic, capacity) == (HTTPROUTE, SURGE) else 0, canary, 100)
    if capacity == REPLACE_IN_PLACE:
        canary = min(canary, total)
        stable = total - canary
        if stable == 0 and total > 1:
            canary, stable = total - 1, 1
    elif traffic == HTTPROUTE:
        stable = total
    else:
        stable = math.ceil(total * (100 - weight) / 100)
    if traffic == HTTPROUTE:
        effective = weight if stable > 0 else 100
    else:
        effective = round(100 * canary / (stable + canary)) if stable + canary else 0
    return Split(stable, canary, effective)
