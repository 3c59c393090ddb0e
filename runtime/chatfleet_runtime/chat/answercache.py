"""Answers for hot questions from memory: the chat API's opt-in answer cache (spec.runtime.answerCache).

Customer-service traffic asks a few questions all day. With the cache on, the answer the model gave to a
first-turn question is kept, and the same question is answered from memory for `ttl_s` seconds, without
asking Triton. What counts as the same question (the key):

- the pod's revision (a release never answers from an old revision's answers; each pod's cache is its
  own memory, so a new pod starts empty anyway) and the model name;
- the system prompts, as sent;
- the user's question, normalised: Unicode case folded, runs of whitespace made one space, ends trimmed
  ("What are your  opening hours? " and "what are your opening hours?" are the same question);
- every sampling setting (max_tokens, temperature, top_p, stop, seed, penalties, logit bias).

Only a **first turn** is cached or answered from the cache: one user message (system prompts allowed),
no assistant message, and no stored history for its session (a turn with history depends on it). Only
**greedy** requests (temperature 0), unless `sampled` is on: a sampled answer served again is always the
same answer, which the spec must ask for. Only whole answers the model gave are kept (not fallbacks, not
answers cut by the deadline, not streams the client left). The cache holds at most `max_entries` and
`max_bytes` of answer text (MAX_BYTES: well inside the chat API container's memory), the least recently
used going first; an entry older than `ttl_s` is never served.
"""

from __future__ import annotations

import hashlib
import json
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Answer text the cache keeps at most (UTF-8 bytes), whatever maxEntries says: the chat API container's
#: memory (512Mi by default) must hold it beside everything else.
MAX_BYTES = 64 * 1024 * 1024

#: PARAMETERS of the Triton model that are no sampling setting (they do not change the answer).
_NOT_SAMPLING = ("session_id",)


@dataclass(frozen=True)
class Cached:
    """One kept answer."""

    text: str
    finish_reason: str
    prompt_tokens: int
    num_tokens: int
    at: float


def normalise(text: str) -> str:
    """The question as the key sees it.

    >>> normalise("  What are your\\n opening HOURS? ")
    'what are your opening hours?'
    """
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class AnswerCache:
    """First-turn answers by question, revision and sampling settings; LRU-bounded, with a TTL."""

    def __init__(
        self,
        ttl_s: float = 300.0,
        max_entries: int = 1000,
        sampled: bool = False,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max(1, max_entries)
        self.max_bytes = max_bytes
        self.sampled = sampled
        self.clock = clock
        self._entries: OrderedDict[str, Cached] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def key(
        self,
        messages: Sequence[Mapping[str, str]],
        params: Mapping[str, Any],
        history_turns: int,
        revision: str | None,
        model: str,
    ) -> str | None:
        """The cache key of a turn, or None when the turn is not cacheable (a later turn, stored history,
        a sampled request without `sampled`)."""
        if history_turns:
            return None
        users = [m for m in messages if m.get("role") == "user"]
        if len(users) != 1 or any(m.get("role") not in ("system", "user") for m in messages):
            return None
        if float(params.get("temperature") or 0.0) > 0.0 and not self.sampled:
            return None
        essence = {
            "revision": revision or "",
            "model": model,
            "system": [m.get("content", "") for m in messages if m.get("role") == "system"],
            "question": normalise(users[0].get("content", "")),
            "sampling": {k: v for k, v in params.items() if k not in _NOT_SAMPLING},
        }
        return hashlib.sha256(json.dumps(essence, sort_keys=True, default=str).encode()).hexdigest()

    def get(self, key: str) -> Cached | None:
        """The kept answer, if younger than the TTL (it becomes the most recently used)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.clock() - entry.at >= self.ttl_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, text: str, finish_reason: str, prompt_tokens: int, num_tokens: int) -> None:
        """Keep a whole answer; the least recently used entries go while the cache is over its bounds (an
        answer larger than the byte bound is not kept)."""
        size = len(text.encode())
        if size > self.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = Cached(text, finish_reason, prompt_tokens, num_tokens, self.clock())
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        self._bytes -= len(self._entries.pop(key).text.encode())
