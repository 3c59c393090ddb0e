"""Conversation history in Redis: a sliding window of turns with a TTL, shared by every replica.

Key ``chatfleet:session:<model>:<id>`` is a Redis list, one JSON turn per element
(``{"messages": [...], "reply": "...", "at": <unix time>, "revision": "<pod revision>"|null}``), trimmed to the last N turns and expiring TTL seconds after
the last write. Each read and write is tried twice (a loaded node or a Redis fail-over can miss one
0.5 s time-out; a dialogue that lost its history is an outage for that user); the second write first
checks whether the first one landed (its turn, unique by its timestamp, is the list's last element), so
a turn is never stored twice. Redis trouble never fails a chat turn: reads return no history, writes
are skipped, and ``on_error(op)`` is called so the API can count it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


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
    ):
        self.client = client
        self.prefix = f"chatfleet:session:{namespace}:"
        self.ttl_s = ttl_s
        self.turns = turns
        self.on_error = on_error or (lambda op: None)

    def key(self, session_id: str) -> str:
        """Redis key of a conversation."""
        return self.prefix + session_id

    async def history(self, session_id: str) -> History:
        """The last N turns, read at most twice (ok is False when there is no Redis or it could not be read)."""
        if self.client is None or self.turns <= 0:
            return History(ok=self.client is not None)
        key = self.key(session_id)
        try:
            try:
                raw = await self.client.lrange(key, -self.turns, -1)
            except Exception as exc:  # once more: a time-out under load is not a lost history
                log.info("session history read failed, retrying once: %s", exc)
                raw = await self.client.lrange(key, -self.turns, -1)
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
        transaction, tried twice (never stored twice); False on Redis error."""
        if self.client is None or self.turns <= 0:
            return False
        turn = json.dumps(
            {"messages": list(messages), "reply": reply, "at": round(time.time(), 3), "revision": revision}
        )
        key = self.key(session_id)
        try:
            try:
                await self._push(key, turn)
            except Exception as exc:  # once more, unless the first try landed after all
                log.info("session history write failed, retrying once: %s", exc)
                if await self.client.lindex(key, -1) != turn:
                    await self._push(key, turn)
        except Exception as exc:
            log.warning("session history not saved: %s", exc)
            self.on_error("write")
            return False
        return True

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
