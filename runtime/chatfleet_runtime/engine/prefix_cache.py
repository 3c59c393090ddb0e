"""A bounded, least-recently-used store of KV caches for prompt prefixes (conversations, system prompts).

Entries are immutable once stored: a hit hands out views that the generator copies into a new batch
cache, never mutates. Two kinds of keys share one budget:

- ``session:<id>``: the conversation's full token sequence so far (prompt + answer) and its KV; the next
  turn on the same replica reuses the longest common token prefix.
- ``system:<hash>``: the KV of a system prompt's tokens, computed once and shared by every conversation
  that starts with it.

Tensors are opaque here (anything with ``.nbytes`` or ``element_size()*numel()``), so the LRU logic is
tested without torch.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix_len([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _nbytes(t: Any) -> int:
    if hasattr(t, "element_size"):
        return int(t.element_size() * t.numel())
    return int(getattr(t, "nbytes", 0))


def system_key(ids: Sequence[int]) -> str:
    """Cache key of a system-prompt prefix (hash of its token ids)."""
    return "system:" + hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:20]


def session_key(session_id: str) -> str:
    """Cache key of a conversation."""
    return "session:" + session_id


@dataclass(frozen=True)
class Entry:
    """Token ids and per-layer (key, value) tensors of shape [1, heads, len(ids), head_dim]."""

    ids: tuple[int, ...]
    layers: tuple[tuple[Any, Any], ...]
    nbytes: int


@dataclass(frozen=True)
class Hit:
    """A usable prefix: reuse the first `length` positions of `entry`."""

    key: str
    entry: Entry
    length: int


class PrefixCache:
    """LRU cache bounded by entry count and bytes; thread-safe."""

    def __init__(self, max_entries: int = 64, max_bytes: int = 256 * 2**20):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held by all entries."""
        return self._bytes

    def put(self, key: str, ids: Sequence[int], layers: Sequence[tuple[Any, Any]]) -> None:
        """Store (or replace) an entry, then evict least-recently-used ones over the bounds."""
        if self.max_entries <= 0:
            return
        nbytes = sum(_nbytes(k) + _nbytes(v) for k, v in layers)
        if nbytes > self.max_bytes:
            return
        entry = Entry(tuple(ids), tuple((k, v) for k, v in layers), nbytes)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = entry
            self._bytes += nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.evictions += 1

    def has(self, key: str) -> bool:
        """Whether a key is stored (does not touch recency)."""
        return key in self._entries

    def lookup(self, prompt_ids: Sequence[int], keys: Sequence[str]) -> Hit | None:
        """Best reusable prefix among `keys` for a prompt, leaving at least one prompt token to compute."""
        best: Hit | None = None
        limit = len(prompt_ids) - 1
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                n = min(common_prefix_len(entry.ids, prompt_ids), limit)
                if n > 0 and (best is None or n > best.length):
                    best = Hit(key, entry, n)
            if best is None:
                self.misses += 1
                return None
            self._entries.move_to_end(best.key)
            self.hits += 1
            self.reused_tokens += best.length
        return best

    def drop(self, key: str) -> None:
        """Remove one entry if present."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
