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

Each replica also keeps its own copy of the windows it last read or wrote (`Windows`: bounded by count,
by characters and by the TTL). A Redis that restarted with nothing kept (no persistence) lost every
dialogue: a read that finds a window lacking turns this replica's copy has puts the two together back (one
transaction) and answers with them (`History.source` "restored"); a Redis that cannot be read answers a
dialogue this replica has seen with its copy ("replica") instead of none. A copy lacks the turns other
replicas answered since it was made, so a dialogue kept on its replica (the picker, one pod) gets back all
of its turns, one spread over replicas part of them, turn by turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Seconds a read or a write keeps trying after its first try failed (each try is bounded by the client's
#: own time-outs), and the pause between tries.
RETRY_S, PAUSE_S = 4.0, 0.2
#: Seconds after an operation gave up during which the others try once only.
DOWN_S = 10.0
#: Dialogues whose last window a replica keeps in memory, and the characters of their turns at most (the
#: least recently used go first): 32 Mi characters, a small part of the chat-api container's 512 MiB.
LOCAL_DIALOGUES, LOCAL_CHARS = 10_000, 32 * 2**20


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
    source: str = "redis"
    """Where the turns came from: "redis"; "restored" (Redis had lost them, this replica's copy was put
    back); "replica" (Redis could not be read, this replica's copy answered)."""


def _at(raw: str) -> float:
    """A stored turn's time ("at"); -inf for one that cannot be read."""
    try:
        at = json.loads(raw).get("at")
    except (TypeError, ValueError, AttributeError):
        return float("-inf")
    return at if isinstance(at, int | float) else float("-inf")


class Windows:
    """This replica's copy of the windows it last read or wrote: `limit` dialogues and `chars` characters
    of turns at most (the least recently used dropped first). A window expires as Redis's copy does,
    `ttl_s` after its newest turn was written (its "at", wall-clock time): a copy never outlives what Redis
    would have kept."""

    def __init__(
        self,
        ttl_s: float,
        limit: int = LOCAL_DIALOGUES,
        chars: int = LOCAL_CHARS,
        wall: Callable[[], float] = time.time,
    ):
        self.ttl_s = ttl_s
        self.limit = limit
        self.chars = chars
        self.wall = wall
        self._kept: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self.size = 0
        """Characters of the kept turns."""

    def __len__(self) -> int:
        return len(self._kept)

    def _expired(self, turns: Sequence[str]) -> bool:
        return self.wall() - _at(turns[-1]) > self.ttl_s

    def _drop(self, session_id: str | None = None) -> None:
        """Drop a dialogue's window (the least recently used one without `session_id`)."""
        turns = (
            self._kept.pop(session_id, ()) if session_id is not None else self._kept.popitem(last=False)[1]
        )
        self.size -= sum(map(len, turns))

    def get(self, session_id: str) -> tuple[str, ...]:
        """The kept window (stored turns as Redis holds them, oldest first); () when none or expired."""
        turns = self._kept.get(session_id)
        if turns is None:
            return ()
        if self._expired(turns):
            self._drop(session_id)
            return ()
        return turns

    def put(self, session_id: str, turns: Sequence[str]) -> None:
        """Keep `turns` as the dialogue's window; the least recently used and expired ones go."""
        self._drop(session_id)
        if turns and self.limit > 0 and not self._expired(turns):
            self._kept[session_id] = tuple(turns)
            self.size += sum(map(len, turns))
        while self._kept and (
            len(self._kept) > self.limit
            or self.size > self.chars
            or self._expired(next(iter(self._kept.values())))
        ):
            self._drop()


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
        on_replica: Callable[[str], None] | None = None,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        local_dialogues: int = LOCAL_DIALOGUES,
        local_chars: int = LOCAL_CHARS,
    ):
        self.client = client
        self.prefix = f"chatfleet:session:{namespace}:"
        self.ttl_s = ttl_s
        self.turns = turns
        self.on_error = on_error or (lambda op: None)
        self.on_replica = on_replica or (lambda source: None)
        """Called with "restored" or "replica" when this replica's copy answered (see History.source)."""
        self.windows = Windows(ttl_s, local_dialogues, local_chars)
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

        kept = self.windows.get(session_id)
        try:
            raw = [
                item.decode() if isinstance(item, bytes) else item
                for item in await self._tried("read", read, read)
            ]
        except Exception as exc:  # any Redis failure: answer with this replica's copy, or without history
            log.warning("session history unavailable: %s", exc)
            self.on_error("read")
            if not kept:
                return History(ok=False)
            self.on_replica("replica")
            return self._loaded(kept, "replica")
        source = "redis"
        # only when the copy has turns Redis lacks: the window of both, by time (a stable sort: ties keep
        # their order); turns that only left Redis by its trim are older than its newest N and fall off
        # again, so this differs from Redis's window only when Redis lost turns this replica has (a
        # restart, or another replica's partial put-back). Redis's own order is never re-sorted: turns of
        # replicas whose clocks differ would otherwise be rewritten on every read.
        missing = set(kept).difference(raw)
        merged = sorted(dict.fromkeys([*raw, *kept]), key=_at)[-self.turns :] if missing else raw
        if merged != raw:
            raw, source = merged, "restored"
            self.on_replica(source)
            try:
                await self._replace(key, raw)
            except Exception as exc:  # the next turn's write stores the window's newest turn anyway
                log.warning("session history not restored: %s", exc)
                self.on_error("restore")
        self.windows.put(session_id, raw)
        return self._loaded(raw, source)

    @staticmethod
    def _loaded(raw: Sequence[str], source: str) -> History:
        """The History of stored turns `raw` (unreadable ones skipped)."""
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
            history_messages(turns), True, len(turns), revision if isinstance(revision, str) else None, source
        )

    async def append(
        self, session_id: str, messages: Sequence[dict[str, str]], reply: str, revision: str | None = None
    ) -> bool:
        """Add a turn (with the revision that answered it) to this replica's copy, and in Redis trim to the
        window and refresh the TTL in one transaction, tried as `_tried` says (never stored twice). True
        when the dialogue's next turn can read it: stored in Redis, or, on a Redis error (reported to
        `on_error`), kept in this replica's copy."""
        if self.client is None or self.turns <= 0:
            return False
        turn = json.dumps(
            {"messages": list(messages), "reply": reply, "at": round(time.time(), 3), "revision": revision}
        )
        key = self.key(session_id)
        self.windows.put(session_id, [*self.windows.get(session_id), turn][-self.turns :])

        async def again() -> None:  # unless an earlier try landed after all
            if await self.client.lindex(key, -1) != turn:
                await self._push(key, turn)

        try:
            await self._tried("write", lambda: self._push(key, turn), again)
        except Exception as exc:
            log.warning("session history not saved in Redis, kept in this replica's copy: %s", exc)
            self.on_error("write")
            return bool(self.windows.get(session_id))
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

    async def _replace(self, key: str, turns: Sequence[str]) -> None:
        """Put back a window Redis lost, in one transaction, once; it expires when it would have."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.rpush(key, *turns)
            pipe.expireat(key, int(_at(turns[-1]) + self.ttl_s) + 1)
            await pipe.execute()

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
