"""Conversation history in Redis: a sliding window of turns with a TTL, shared by every replica.

Key ``chatfleet:session:<model>:<id>`` is a Redis list, one JSON turn per element
(``{"messages": [...], "reply": "...", "at": <unix time>, "revision": "<pod revision>"|null}``), trimmed to the last N turns and expiring TTL seconds after
the last write. A read or a write that fails is tried again, every PAUSE_S, until RETRY_S have passed
since its first try (a dialogue that lost its history is an outage for that user): a loaded node can
miss a time-out for a second or two -- `make bench-release-traffic` on a 2-core machine saw three
writes of one pod fail at once with "Timeout connecting to server", and in another run 8 turns lost
their history when two tries a second apart both failed. A write tried again first checks whether an
earlier try landed (its turn, unique by its timestamp, is the list's last element), so a turn is never
stored twice. Redis trouble never fails a chat turn: reads return no history, writes are skipped, and
``on_error(op)`` is called so the API can count it; once an operation used its whole budget, the ones
in the next DOWN_S seconds try once only (Redis is down: answer without waiting).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Seconds a read or a write keeps trying after its first try failed (each try is bounded by the client's
#: own time-outs), and the pause between tries.
RETRY_S, PAUSE_S = 4.0, 0.2
#: Seconds after an operation gave up during which the others try once only.
DOWN_S = 10.0


def history_messages(turns: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Flatten stored turns into chat messages (each turn's messages, then the assistant reply)."""
    out: list[dict[str, str]] = []
    for turn in turns:
        out.extend({"role": m["role"], "content": m["content"]} for m in turn.get("messages", []))
        if turn.get("reply"):
            out.append({"role": "assistant", "content": turn["reply"]})
    return out


def compose(
    request_messages: Sequence[dict[str, str]], history: Sequence[dict[str, str]]
) -> list[dict[str, str]]:
    """Prompt messages for a turn: the request's system messages, the history, then the new messages."""
    system = [m for m in request_messages if m["role"] == "system"]
    new = [m for m in request_messages if m["role"] != "system"]
    return [*system, *history, *new]


@dataclass(frozen=True)
class History:
    """A conversation's stored turns as loaded for one request."""

    messages: list[dict[str, str]] = field(default_factory=list)
    """The turns flattened into chat messages (see history_messages)."""
    ok: bool = False
    """False when there is no Redis or it could not be read."""
    turns: int = 0
    """How many stored turns were loaded."""
    revision: str | None = None
    """The revision that answered the last loaded turn, when it was recorded."""


class SessionStore:
    """Redis-backed history (redis.asyncio client); None client means sessions without memory."""

    def __init__(
        self,
        client,
        *,
        namespace: str = "chat",
        ttl_s: int = 3600,
        turns: int = 5,
        on_error: Callable[[str], None] | None = None,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.client = client
        self.prefix = f"chatfleet:session:{namespace}:"
        self.ttl_s = ttl_s
        self.turns = turns
        self.on_error = on_error or (lambda op: None)
        self.retry_s = retry_s
        self.clock = clock
        self.sleep = sleep
        self._down_until = float("-inf")
        """Until when (clock time) operations try once only: an operation gave up."""

    def key(self, session_id: str) -> str:
        """Redis key of a conversation."""
        return self.prefix + session_id

    async def history(self, session_id: str) -> History:
        """The last N turns, tried as `_tried` says (ok is False when there is no Redis or it could not be read)."""
        if self.client is None or self.turns <= 0:
            return History(ok=self.client is not None)
        key = self.key(session_id)

        def read() -> Awaitable[Any]:
            return self.client.lrange(key, -self.turns, -1)

        try:
            raw = await self._tried("read", read, read)
        except Exception as exc:  # any Redis failure: answer without history
            log.warning("session history unavailable: %s", exc)
            self.on_error("read")
            return History(ok=False)
        turns = []
        for item in raw:
            try:
                turn = json.loads(item)
            except (TypeError, ValueError):
                continue
            if isinstance(turn, dict):
                turns.append(turn)
        revision = turns[-1].get("revision") if turns else None
        return History(
            history_messages(turns), True, len(turns), revision if isinstance(revision, str) else None
        )

    async def append(
        self, session_id: str, messages: Sequence[dict[str, str]], reply: str, revision: str | None = None
    ) -> bool:
        """Add a turn (with the revision that answered it), trim to the window and refresh the TTL in one
        transaction, tried as `_tried` says (never stored twice); False on Redis error."""
        if self.client is None or self.turns <= 0:
            return False
        turn = json.dumps(
            {"messages": list(messages), "reply": reply, "at": round(time.time(), 3), "revision": revision}
        )
        key = self.key(session_id)

        async def again() -> None:  # unless an earlier try landed after all
            if await self.client.lindex(key, -1) != turn:
                await self._push(key, turn)

        try:
            await self._tried("write", lambda: self._push(key, turn), again)
        except Exception as exc:
            log.warning("session history not saved: %s", exc)
            self.on_error("write")
            return False
        return True

    async def _tried(
        self, op: str, first: Callable[[], Awaitable[Any]], again: Callable[[], Awaitable[Any]]
    ) -> Any:
        """`first()`; when it fails, `again()` every PAUSE_S until one succeeds or `retry_s` have passed
        since the first try (one try only within DOWN_S of an operation that gave up); the last error."""
        start = self.clock()
        once = start < self._down_until
        try:
            result = await first()
        except Exception as exc:
            error = exc
            while not once and self.clock() - start < self.retry_s:
                log.info("session history %s failed, trying again: %s", op, error)
                await self.sleep(PAUSE_S)
                try:
                    result = await again()
                    break
                except Exception as exc2:
                    error = exc2
            else:
                self._down_until = self.clock() + DOWN_S
                raise error from None
        self._down_until = float("-inf")
        return result

    async def _push(self, key: str, turn: str) -> None:
        """Append, trim to the window and refresh the TTL, in one transaction."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.rpush(key, turn)
            pipe.ltrim(key, -self.turns, -1)
            pipe.expire(key, self.ttl_s)
            await pipe.execute()


class ActiveSessions:
    """Conversations seen by this replica within the TTL (the active-sessions gauge), or within a shorter
    window (the open-dialogues gauge); entries older than the TTL are pruned."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic, limit: int = 100_000):
        self.ttl_s = ttl_s
        self.clock = clock
        self.limit = limit
        self._seen: dict[str, float] = {}

    def touch(self, session_id: str) -> None:
        """Mark a conversation active now."""
        self._seen.pop(session_id, None)
        self._seen[session_id] = self.clock()
        if len(self._seen) > self.limit:
            self._seen.pop(next(iter(self._seen)))

    def count(self, within_s: float | None = None) -> int:
        """Conversations seen within the TTL, or within ``within_s`` when given (expired ones are pruned)."""
        now = self.clock()
        cutoff = now - self.ttl_s
        for sid in [s for s, t in self._seen.items() if t < cutoff]:
            del self._seen[sid]
        if within_s is None:
            return len(self._seen)
        return sum(1 for t in self._seen.values() if t >= now - within_s)
