"""The LRU prefix cache: longest reusable prefix, bounds by entries and bytes (no torch needed)."""

from __future__ import annotations

import pytest
from chatfleet_runtime.engine.prefix_cache import PrefixCache, common_prefix_len, session_key, system_key


class Blob:
    """Stands in for a tensor: only its size matters to the cache."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


def layers(nbytes: int = 10):
    return [(Blob(nbytes), Blob(nbytes))]


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        pytest.param([], [1], 0, id="empty"),
        pytest.param([1, 2, 3], [1, 2, 3], 3, id="equal"),
        pytest.param([1, 2, 3], [1, 2, 4], 2, id="diverge"),
        pytest.param([1, 2], [1, 2, 3, 4], 2, id="prefix"),
        pytest.param([9], [1], 0, id="none"),
    ],
)
def test_common_prefix_len(a, b, n):
    assert common_prefix_len(a, b) == n


def test_lookup_prefers_longest_and_leaves_one_token():
    cache = PrefixCache()
    cache.put(system_key([1, 2]), [1, 2], layers())
    cache.put(session_key("c"), [1, 2, 3, 4, 5], layers())
    hit = cache.lookup([1, 2, 3, 4, 5], [session_key("c"), system_key([1, 2])])
    assert (hit.key, hit.length) == (session_key("c"), 4)  # one prompt token is always computed
    hit = cache.lookup([1, 2, 9], [session_key("c"), system_key([1, 2])])
    assert hit.length == 2
    assert cache.lookup([7, 8], [session_key("c")]) is None
    assert (cache.hits, cache.misses) == (2, 1)


@pytest.mark.parametrize(
    ("max_entries", "max_bytes", "puts", "left"),
    [
        pytest.param(2, 10_000, ["a", "b", "c"], ["b", "c"], id="by-count"),
        pytest.param(10, 50, ["a", "b", "c"], ["b", "c"], id="by-bytes"),
        pytest.param(10, 10, ["a"], [], id="entry-larger-than-budget"),
        pytest.param(0, 10_000, ["a"], [], id="disabled"),
    ],
)
def test_eviction_bounds(max_entries, max_bytes, puts, left):
    cache = PrefixCache(max_entries=max_entries, max_bytes=max_bytes)
    for key in puts:
        cache.put(key, [1, 2, 3], layers(10))  # 20 bytes each
    assert [k for k in puts if cache.has(k)] == left
    assert cache.nbytes == 20 * len(left)


def test_lookup_refreshes_recency():
    cache = PrefixCache(max_entries=2)
    cache.put("a", [1, 2], layers())
    cache.put("b", [3, 4], layers())
    assert cache.lookup([1, 2, 9], ["a"]) is not None
    cache.put("c", [5, 6], layers())
    assert cache.has("a") and not cache.has("b")


def test_replace_keeps_byte_count():
    cache = PrefixCache()
    cache.put("a", [1], layers(10))
    cache.put("a", [1, 2], layers(30))
    assert len(cache) == 1 and cache.nbytes == 60
    cache.drop("a")
    assert cache.nbytes == 0
