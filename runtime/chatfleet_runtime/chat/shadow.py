"""Shadow traffic on a canary pod: the bound on mirrored generations and the ring of their records.

During a canary's shadow phase the gateway mirrors a sample of live chat requests to the canary's
shadow port (``--shadow-port``); the pipeline answers each greedily (``ChatPipeline.shadow_chat``) and
``Shadow`` keeps what the operator needs to compare the canary with stable: the messages the model saw,
``max_tokens``, the answer or the error, the time taken. The operator takes the records
(``POST /shadow/records``), asks a stable pod the same messages, and compares. See docs/runtime.md
"Shadow traffic".

``Shadow`` is the whole state, pure: at most ``concurrency`` mirrored generations at once (one more is
refused, never queued: a mirror must not wait behind real work), and at most ``limit`` records (the
oldest goes when full, counted in ``overflowed``). Mirrored prompts stay in the pod's memory until taken.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Records kept until taken; beyond it the oldest goes (and ``overflowed`` grows).
RECORDS_LIMIT = 200


@dataclass(frozen=True)
class ShadowRecord:
    """One mirrored request as answered (or not) here: what the operator replays on stable."""

    id: int
    """Increasing per process, from 1."""
    messages: list[dict[str, str]]
    """The whole message list the model saw (history included), as OpenAI role/content dicts."""
    max_tokens: int
    """The max_tokens it was generated with (the request's, capped at --shadow-max-tokens)."""
    answer: str | None
    """The model's answer; None when it failed."""
    error: str | None
    """Why there is no answer ("HTTP 400: ...", "fallback (timeout)", an exception); None when answered."""
    seconds: float
    """From arrival to answer (history read included)."""


class Shadow:
    """A pod's shadow state: mirrored generations in flight (bounded) and their records (a ring).

    >>> s = Shadow(max_tokens=8, concurrency=1, limit=2)
    >>> s.enter(), s.enter()          # one in flight: the next one is refused at once
    (True, False)
    >>> s.leave(); s.enter()
    True
    >>> for text in ("a", "b", "c"):  # three records in a ring of two: the first goes
    ...     _ = s.record([{"role": "user", "content": text}], 8, text, None, 0.1)
    >>> taken = s.take(); [r["id"] for r in taken["records"]], taken["overflowed"]
    ([2, 3], 1)
    >>> s.take()                      # taken means gone
    {'records': [], 'overflowed': 0}
    """

    def __init__(
        self,
        *,
        max_tokens: int,
        concurrency: int,
        limit: int = RECORDS_LIMIT,
    ):
        self.max_tokens = max(1, max_tokens)
        """The cap on a mirrored request's max_tokens."""
        self.concurrency = max(0, concurrency)
        self.inflight = 0
        """Mirrored requests between admission (``enter``) and their answer (``leave``)."""
        self._records: deque[ShadowRecord] = deque(maxlen=max(1, limit))
        self._last_id = 0
        self.overflowed = 0
        """Records dropped (oldest first) because the ring was full, since the last ``take``."""

    def enter(self) -> bool:
        """Admit one mirrored request if fewer than ``concurrency`` are in flight; False refuses it."""
        if self.inflight >= self.concurrency:
            return False
        self.inflight += 1
        return True

    def leave(self) -> None:
        """An admitted mirrored request is done."""
        self.inflight = max(0, self.inflight - 1)

    def record(
        self,
        messages: Sequence[dict[str, str]],
        max_tokens: int,
        answer: str | None,
        error: str | None,
        seconds: float,
    ) -> ShadowRecord:
        """Keep one record (the oldest goes when the ring is full); the record."""
        self._last_id += 1
        rec = ShadowRecord(
            self._last_id,
            [{"role": m["role"], "content": m["content"]} for m in messages],
            max_tokens,
            answer,
            error,
            round(seconds, 4),
        )
        if len(self._records) == self._records.maxlen:
            self.overflowed += 1
        self._records.append(rec)
        return rec

    def take(self) -> dict[str, Any]:
        """The JSON of ``POST /shadow/records``: the records kept, oldest first, and the overflow count;
        both are reset (what is returned is gone from the pod)."""
        out = {"records": [asdict(r) for r in self._records], "overflowed": self.overflowed}
        self._records.clear()
        self.overflowed = 0
        return out

    def __len__(self) -> int:
        return len(self._records)
