"""The roomy KV layer (``engine/kvcache.py``): the same keys and values as transformers' own layer, written
in place while there is room, copied once when there is not, and joins / selections as the batch needs."""

from __future__ import annotations

import pytest
import torch
from chatfleet_runtime.engine import kvcache
from transformers.cache_utils import DynamicLayer


def _kv(rows: int, columns: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, columns, 4, generator=g), torch.randn(rows, 2, columns, 4, generator=g)


@pytest.mark.parametrize("room", [0, 1, 3, 64])
def test_a_roomy_layer_holds_what_a_dynamic_layer_holds(room):
    plain, roomy = DynamicLayer(), kvcache.RoomyLayer()
    roomy.room = room
    made, last = 0, None
    for step, n in enumerate([5, 1, 1, 1, 1, 2, 1, 1]):  # a prefill, then decode steps (one a 2-token chunk)
        k, v = _kv(3, n, step)
        expected = plain.update(k, v)
        got = roomy.update(k, v)
        assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))
        assert roomy.get_seq_length() == plain.get_seq_length()
        ptr = got[0].untyped_storage().data_ptr()  # a new buffer is made while the old one is alive
        made, last = made + (ptr != last), ptr
        assert got[0].untyped_storage().nbytes() <= k.element_size() * 3 * 2 * 4 * (
            roomy.get_seq_length() + room
        )
    # 13 columns in 8 updates: without room, a new buffer each time (torch.cat's cost); with room, one
    # whenever the columns run out: room 1 at 5+1, 7+1, 9+1, 11+1 columns, room 3 at 5+3, 9+3, 13+3
    assert made == {0: 8, 1: 5, 3: 3, 64: 1}[room]


def test_keys_replaced_from_outside_are_not_written_over():
    """A gather or slice gives the layer new keys: the next update makes new buffers, never writing into
    the old ones (which may be another tensor's memory)."""
    layer = kvcache.RoomyLayer()
    layer.room = 8
    layer.update(*_kv(2, 4, 0))
    old = layer._kbuf
    before = old.clone()
    kept = layer.keys[1:, :, 1:].clone(), layer.values[1:, :, 1:].clone()
    kvcache.replace(layer, *kept)
    k, v = _kv(1, 1, 1)
    keys, values = layer.update(k, v)
    assert torch.equal(keys, torch.cat([kept[0], k], dim=2)) and torch.equal(
        values, torch.cat([kept[1], v], dim=2)
    )
    # bit for bit: the buffer's spare room is uninitialised memory, which may hold NaN (NaN != NaN)
    assert layer._kbuf.shape[0] == 1 and layer._kbuf is not old
    assert torch.equal(old.view(torch.int32), before.view(torch.int32))


def _config():
    from transformers import Qwen2Config

    return Qwen2Config(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, hidden_size=8)


def test_select_and_join_keep_rows_right_aligned_with_room():
    cache = kvcache.new_cache(_config(), [_kv(3, 5, 0)])
    assert isinstance(cache.layers[0], kvcache.RoomyLayer)
    keys = cache.layers[0].keys.clone()
    kvcache.select(cache, torch.tensor([0, 2]), first=2, room=4)
    layer = cache.layers[0]
    assert torch.equal(layer.keys, keys[[0, 2], :, 2:]) and layer._kbuf.shape[2] == 3 + 4
    a, b = _kv(2, 3, 1)[0], _kv(1, 5, 2)[0]
    joined = kvcache.joined(a, b, width=5, room=2)
    assert joined.shape == (3, 2, 7, 4)
    assert torch.equal(joined[:2, :, 2:5], a) and not joined[:2, :, :2].any()
    assert torch.equal(joined[2:, :, :5], b)
    merged = kvcache.adopted(_config(), [(joined, joined.clone())], width=5)
    assert merged.layers[0].keys.shape[2] == 5 and merged.layers[0].get_seq_length() == 5
    merged.layers[0].update(*_kv(3, 1, 3))
    assert merged.layers[0].keys.untyped_storage().data_ptr() == joined.untyped_storage().data_ptr()
