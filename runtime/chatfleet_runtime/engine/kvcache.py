"""The running batch's KV cache with room to grow: a decode step writes its column in place.

Transformers' ``DynamicLayer`` appends a step's keys and values with ``torch.cat``: every decode step
copies the whole cache, every layer, to add one column. At 32 rows and 1,100 columns of the benchmark's
Qwen2-0.5B-shaped model (8 layers) that is 288 MiB copied per step, about 200 ms on one CPU thread of
this machine, next to ~330 ms of matrix products; and a fresh cache-sized allocation per layer per step,
which the allocator hands back to the system at its own pace (the soak's resident memory swung by
hundreds of MiB).

A ``RoomyLayer`` keeps its keys and values as views of buffers with spare columns on the right: a step
writes into the spare columns and the views widen by one, nothing is copied. The buffers are made again
(one copy) only when the room runs out, or when rows leave or join (``select``, ``joined``), which copied
the cache before too. The generator says how much room a buffer gets (``set_room``): never past the
widest the batch can become, so the KV budget, which counts rows x the longest prompt + max tokens, holds
the buffers as well (``storage_bytes`` is what they take).

Anything else that replaces a layer's keys (a gather, a slice) simply leaves the buffers behind: the next
update sees that the keys are no longer a view of them and makes new ones.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

#: Spare columns a buffer is made with (fewer when the batch cannot grow that far): one copy per ROOM
#: decode steps at most, instead of one per step.
ROOM = 64


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers with spare columns; updates write in place."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.room = 0
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        width = self.get_seq_length()
        if not self._writable(width + n, key_states):
            keys = self.keys if width else None
            values = self.values if width else None
            self.place(keys, values, width + n + self.room, like=key_states)
        self._kbuf[:, :, width : width + n].copy_(key_states)
        self._vbuf[:, :, width : width + n].copy_(value_states)
        self.adopt(self._kbuf, self._vbuf, width + n)
        return self.keys, self.values

    def place(self, keys, values, capacity: int, like: torch.Tensor | None = None) -> None:
        """New buffers of `capacity` columns holding `keys` / `values` (or none) on the left; one copy."""
        ref = keys if keys is not None else like
        rows, heads, width, dim = ref.shape if keys is not None else (*ref.shape[:2], 0, ref.shape[3])
        capacity = max(capacity, width)
        # Drop the old buffers before making the new ones where nothing is copied from them.
        self._kbuf = self._vbuf = None
        kbuf = ref.new_empty((rows, heads, capacity, dim))
        vbuf = ref.new_empty((rows, heads, capacity, dim))
        if width:
            kbuf[:, :, :width].copy_(keys)
            vbuf[:, :, :width].copy_(values)
        self.adopt(kbuf, vbuf, width)

    def adopt(self, kbuf: torch.Tensor, vbuf: torch.Tensor, width: int) -> None:
        """Make `kbuf` / `vbuf` the layer's buffers, their first `width` columns its keys and values."""
        self._kbuf, self._vbuf = kbuf, vbuf
        self.keys, self.values = kbuf[:, :, :width], vbuf[:, :, :width]

    def _writable(self, needed: int, like: torch.Tensor) -> bool:
        """Whether the keys are still the left part of the buffers and `needed` columns fit in them."""
        buf, keys = self._kbuf, self.keys
        return (
            buf is not None
            and keys is not None
            and keys.dim() == 4
            and keys.data_ptr() == buf.data_ptr()
            and keys.stride() == buf.stride()
            and keys.shape[0] == buf.shape[0] == like.shape[0]
            and needed <= buf.shape[2]
        )


def _empty_cache(config) -> DynamicCache:
    """An empty cache for `config` whose plain dynamic layers are roomy (sliding-window and other layers stay
    as transformers makes them)."""
    cache = DynamicCache(config=config)
    cache.layers = [RoomyLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def set_room(cache: DynamicCache, room: int) -> None:
    """How many spare columns the next buffers of every roomy layer get."""
    for layer in cache.layers:
        if isinstance(layer, RoomyLayer):
            layer.room = max(0, room)


def select(cache: DynamicCache, index: torch.Tensor, first: int, room: int) -> None:
    """Keep the rows at `index` and the columns from `first` on, copied once into buffers with `room` to spare."""
    for layer in cache.layers:
        keys, values = layer.keys[index, :, first:], layer.values[index, :, first:]
        if isinstance(layer, RoomyLayer):
            layer.place(keys, values, keys.shape[2] + max(0, room))
        else:
            layer.keys, layer.values = keys, values


def joined(a, b, width: int, room: int) -> torch.Tensor:
    """Rows of `a` over rows of `b` ([rows, heads, columns, dim]), each right-aligned in `width` columns, left
    padding zeroed, with `room` spare columns; the result is a view of its buffer (see ``RoomyLayer.place``)."""
    rows_a, rows_b = a.shape[0], b.shape[0]
    buf = a.new_empty((rows_a + rows_b, a.shape[1], width + max(0, room), a.shape[3]))
    buf[:rows_a, :, : width - a.shape[2]].zero_()
    buf[:rows_a, :, width - a.shape[2] : width].copy_(a)
    buf[rows_a:, :, : width - b.shape[2]].zero_()
    buf[rows_a:, :, width - b.shape[2] : width].copy_(b)
    return buf


def new_cache(config, layers=None) -> DynamicCache:
    """A cache for `config` with roomy layers, holding a copy of `layers` ((keys, values) per layer) if given."""
    cache = _empty_cache(config)
    for layer, (keys, values) in zip(cache.layers, layers or [], strict=False):
        layer.update(keys, values)
    return cache


def adopted(config, buffers, width: int) -> DynamicCache:
    """A cache for `config` whose roomy layers take `buffers` ((keys, values) per layer, from ``joined``) as
    their own, `width` columns of them live; no copy."""
    cache = _empty_cache(config)
    for layer, (kbuf, vbuf) in zip(cache.layers, buffers, strict=True):
        if isinstance(layer, RoomyLayer):
            layer.lazy_initialization(kbuf, vbuf)
            layer.adopt(kbuf, vbuf, width)
        else:  # a layer that is not one column per position (a sliding window) holds what it was given
            layer.update(kbuf, vbuf)
    return cache


def replace(layer, keys, values) -> None:
    """Give a layer new keys and values (a gather's copy), dropping its buffers at once."""
    release(layer)
    layer.keys, layer.values = keys, values


def release(layer) -> None:
    """Drop a layer's tensors, its buffers included (a cache that was merged into another)."""
    layer.keys = layer.values = None
    if isinstance(layer, RoomyLayer):
        layer._kbuf = layer._vbuf = None


def storage_bytes(cache: DynamicCache) -> int:
    """Bytes the cache's tensors hold on the device, spare columns included (each storage counted once)."""
    seen: dict[int, int] = {}
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            if t is not None:
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
