"""Admission by KV budget (pure): whether one more row fits the running batch's KV cache, and who waits.

The running batch holds one padded KV cache, ``rows x width`` positions, where the width is the longest
live row's span. A row's span at most is its prompt plus its max tokens, so a batch's cache at its
widest is ``rows x max(span) x bytes per position``. A request joins when that product, with it in the
batch, stays within the budget; otherwise it waits in a bounded queue (first come, first served), and is
refused when the queue is full or it waited too long. The engine (``InflightEngine``) applies the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def kv_bytes_per_position(layers: int, kv_heads: int, head_dim: int, element_size: int) -> int:
    """Bytes one position of one row takes in the KV cache (keys and values of every layer).

    >>> kv_bytes_per_position(layers=24, kv_heads=2, head_dim=64, element_size=2)  # Qwen2-0.5B, bf16
    12288
    """
    return 2 * layers * kv_heads * head_dim * element_size


def batch_kv_bytes(spans: Sequence[int], per_position: int) -> int:
    """The padded cache of a batch at its widest: rows x the longest span x bytes per position.

    >>> batch_kv_bytes([100, 300, 200], per_position=12288)  # 3 x 300 x 12 KiB
    11059200
    """
    return len(spans) * max(spans, default=0) * per_position


def fits(live: Sequence[int], span: int, per_position: int, budget: int) -> bool:
    """Whether a row of `span` positions may join rows of `live` spans within `budget` bytes (0: no budget).

    >>> fits([300, 300], 300, per_position=10, budget=9000)  # 3 x 300 x 10 = 9000
    True
    >>> fits([300, 300], 400, per_position=10, budget=9000)  # 3 x 400 x 10 = 12000
    False
    """
    return budget <= 0 or batch_kv_bytes([*live, span], per_position) <= budget


@dataclass(frozen=True)
class Plan:
    """What to do with the waiting requests now: indices (into the waiting list) to admit and to refuse."""

    admit: tuple[int, ...] = ()
    refuse: tuple[int, ...] = ()


def plan_admission(
    live: Sequence[int],
    waiting: Sequence[tuple[int, float]],
    *,
    per_position: int,
    budget: int,
    room: int,
    max_waiting: int,
    max_wait_s: float,
    now: float,
) -> Plan:
    """Admit waiting (span, arrived) requests in order while they fit; refuse those past the limits.

    First come, first served: once one does not fit, the ones behind it wait too (a stream of short
    requests never starves a long one). Refused: a request that waited `max_wait_s`, one that cannot
    fit even alone, and the newest beyond `max_waiting` still waiting.

    >>> plan_admission([300], [(300, 0.0), (300, 1.0), (100, 2.0)], per_position=10, budget=6000,
    ...                room=8, max_waiting=1, max_wait_s=10.0, now=3.0)
    Plan(admit=(0,), refuse=(2,))
    """
    admit: list[int] = []
    refuse: list[int] = []
    spans = list(live)
    blocked = False
    still: list[int] = []
    for i, (span, arrived) in enumerate(waiting):
        if not fits([], span, per_position, budget):
            refuse.append(i)
        elif not blocked and len(spans) < room and fits(spans, span, per_position, budget):
            admit.append(i)
            spans.append(span)
        elif now - arrived >= max_wait_s:
            refuse.append(i)
        else:
            blocked = True
            still.append(i)
    refuse += still[max_waiting:]
    return Plan(tuple(admit), tuple(sorted(refuse)))
