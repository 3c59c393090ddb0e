"""Prefill: prompts into a batch's KV cache, each row from the longest prefix the prefix cache holds for it.

``PrefillSteps`` is ``BatchGenerator``'s base: the generator holds the model and the state (the attributes
below, set in its ``__init__``) and runs the decode loop; these methods run the prompt forward pass of
rows that start together (``_start_together``, behind ``BatchGenerator.start``) or of one row in chunks
(``begin_prefill``, then ``prefill_chunk`` until done, cut by ``chunk_end``), and fill the prefix cache:
shared system prompts once prefilled, a conversation once its row finishes (``_store_session``).

Batch layout (one row per request; ``P`` = reused prefix length, ``n`` = prompt tokens still to compute)::

    [pad * (Pmax - P_i) | cached prefix (P_i) | pad * (Nmax - n_i) | new prompt tokens (n_i)]

Pads are masked out and positions are explicit, so rows with and without a cache hit share one prefill;
``_right_align`` then moves each row's columns to the right edge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chatfleet_runtime.engine.prefix_cache import PrefixCache, session_key, system_key
from chatfleet_runtime.engine.rows import Batch, Prefill, Row


class PrefillSteps:
    """The prefill of ``BatchGenerator`` (its base) and the prefix cache's lookups and stores."""

    # set by BatchGenerator.__init__
    torch: Any
    model: Any
    device: Any
    pad_id: int
    num_layers: int
    prefix_cache: PrefixCache | None
    clock: Callable[[], float]
    _kv: Any
    """The ``kvcache`` module (imported with torch, when the generator is made)."""

    def begin_prefill(self, row: Row) -> Prefill:
        """Start prefilling one row in chunks (``prefill_chunk``): its cached prefix, if any, is the start."""
        hit = self._lookup(row)
        row.cached = hit.length if hit else 0
        layers = (
            [(k[:, :, : hit.length], v[:, :, : hit.length]) for k, v in hit.entry.layers] if hit else None
        )
        return Prefill(row, self._new_cache(layers), done=row.cached)

    def prefill_chunk(self, prefill: Prefill, tokens: int) -> Batch | None:
        """Compute the next `tokens` prompt tokens of a chunked prefill; the row's one-row batch once done.

        A 1,000-token prompt in chunks of at most 128 takes 8 calls of 125 (``chunk_end``), and the running
        batch decodes between them.
        """
        torch, row = self.torch, prefill.row
        ids = row.req.prompt_ids
        end = chunk_end(prefill.done, len(ids), tokens)
        chunk = torch.tensor([ids[prefill.done : end]], dtype=torch.long, device=self.device)
        # room for the rest of the prompt and the first steps (never past prompt + max tokens): the chunks
        # write in place
        rest = len(ids) - end
        self._kv.set_room(prefill.cache, min(rest + self._kv.ROOM, rest + row.req.params.max_new_tokens))
        out = self.model(
            input_ids=chunk,
            attention_mask=torch.ones((1, end), dtype=torch.long, device=self.device),
            position_ids=torch.arange(prefill.done, end, device=self.device).unsqueeze(0),
            past_key_values=prefill.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        prefill.cache, prefill.done = out.past_key_values, end
        if end < len(ids):
            return None
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        self._store_system_prefixes([row], prefill.cache, mask)
        next_pos = torch.tensor([end], dtype=torch.long, device=self.device)
        return Batch([row], out.logits[:, -1, :], prefill.cache, mask, next_pos, last_check=self.clock())

    # ---- internals ----------------------------------------------------------------------------

    def _lookup(self, row: Row):
        cache, req = self.prefix_cache, row.req
        if cache is None or not req.use_prefix_cache:
            return None
        keys = []
        if req.session_id:
            keys.append(session_key(req.session_id))
        if req.system_len > 0:
            keys.append(system_key(req.prompt_ids[: req.system_len]))
        return cache.lookup(req.prompt_ids, keys) if keys else None

    def _prefill(self, rows: list[Row]):
        """Build the padded batch (reusing cached prefixes) and run the prompt forward pass."""
        torch = self.torch

        hits = [self._lookup(row) for row in rows]
        past_lens = [h.length if h else 0 for h in hits]
        for row, p in zip(rows, past_lens, strict=True):
            row.cached = p
        new_ids = [row.req.prompt_ids[p:] for row, p in zip(rows, past_lens, strict=True)]
        pmax, nmax, bsz = max(past_lens), max(len(n) for n in new_ids), len(rows)
        layers = None
        if pmax:
            template = next(h for h in hits if h).entry.layers
            layers = []
            for layer in range(self.num_layers):
                ks, vs = [], []
                for hit, p in zip(hits, past_lens, strict=True):
                    k0, v0 = template[layer]
                    shape = (1, k0.shape[1], pmax, k0.shape[3])
                    k = k0.new_zeros(shape)
                    v = v0.new_zeros(shape)
                    if hit:
                        hk, hv = hit.entry.layers[layer]
                        k[:, :, pmax - p :] = hk[:, :, :p]
                        v[:, :, pmax - p :] = hv[:, :, :p]
                    ks.append(k)
                    vs.append(v)
                layers.append((torch.cat(ks), torch.cat(vs)))
        cache = self._new_cache(layers)
        input_ids = torch.full((bsz, nmax), self.pad_id, dtype=torch.long)
        mask = torch.zeros((bsz, pmax + nmax), dtype=torch.long)
        positions = torch.zeros((bsz, nmax), dtype=torch.long)
        for i, (ids, p) in enumerate(zip(new_ids, past_lens, strict=True)):
            n = len(ids)
            input_ids[i, nmax - n :] = torch.tensor(ids, dtype=torch.long)
            mask[i, pmax - p : pmax] = 1
            mask[i, pmax + nmax - n :] = 1
            positions[i, nmax - n :] = torch.arange(p, p + n)
        input_ids, mask, positions = (t.to(self.device) for t in (input_ids, mask, positions))
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits: no lm_head over the whole prompt
        )
        next_pos = torch.tensor([len(r.req.prompt_ids) for r in rows], dtype=torch.long, device=self.device)
        self._store_system_prefixes(rows, out.past_key_values, mask)
        cache, mask = self._right_align(out.past_key_values, mask)
        return out.logits[:, -1, :], cache, mask, next_pos

    def _right_align(self, cache, mask):
        """Move each row's real columns to the right edge, then drop the columns no row uses; returns both.

        Rows prefilled together with cached prefixes of different lengths are padded inside,
        [pad | cached | pad | new], so the batch is max(cached) + max(new) wide: wider than its longest
        prompt, which is what the KV budget counts. Keys carry their rotary positions already (positions
        are explicit), so moving columns changes only the width: masks 1001 / 0111 -> 0011 / 0111 -> 011 /
        111 (width 4 -> 3).
        """
        torch = self.torch
        layers = cache.layers
        if not bool((mask[:, 1:] < mask[:, :-1]).any()):  # no row is padded inside: left padding only
            return cache, mask
        if any(layer.keys.shape[-2] != mask.shape[1] for layer in layers):  # not one column per position
            return cache, mask
        keep = int(mask.sum(dim=1).max())
        order = torch.sort(mask, dim=1, stable=True).indices[:, -keep:]  # pads first, real columns in order
        for layer in layers:
            self._kv.replace(
                layer,
                layer.keys.gather(2, _column_index(order, layer.keys)),
                layer.values.gather(2, _column_index(order, layer.values)),
            )
        return cache, mask.gather(1, order)

    def _row_kv(self, cache, mask, b: int, length: int | None = None):
        """Per-layer KV of one batch row at its real (unmasked) positions, optionally the first `length`."""
        idx = mask[b].nonzero().squeeze(-1)
        if length is not None:
            idx = idx[:length]
        return [
            (layer.keys[b : b + 1, :, idx].clone(), layer.values[b : b + 1, :, idx].clone())
            for layer in cache.layers
        ]

    def _store_system_prefixes(self, rows, cache, mask) -> None:
        if self.prefix_cache is None:
            return
        for b, row in enumerate(rows):
            req = row.req
            if not req.use_prefix_cache or req.system_len <= 0 or row.cached >= req.system_len:
                continue
            key = system_key(req.prompt_ids[: req.system_len])
            if not self.prefix_cache.has(key):
                self.prefix_cache.put(
                    key, req.prompt_ids[: req.system_len], self._row_kv(cache, mask, b, req.system_len)
                )

    def _store_session(self, row: Row, cache, mask, b: int) -> None:
        if self.prefix_cache is None or not row.req.session_id or not row.req.use_prefix_cache:
            return
        # The cache holds the prompt and every generated token but the last (never fed back).
        ids = list(row.req.prompt_ids) + row.generated[:-1]
        layers = self._row_kv(cache, mask, b)
        if layers and layers[0][0].shape[2] == len(ids):
            self.prefix_cache.put(session_key(row.req.session_id), ids, layers)

    def _new_cache(self, layers=None):
        """A KV cache with room to grow in place (``kvcache``), holding a copy of `layers` if given."""
        return self._kv.new_cache(self.model.config, layers)

    def _start_together(self, rows: list[Row]) -> Batch:
        """Prefill rows into a new batch (logits pending for the first sampling)."""
        logits, cache, mask, next_pos = self._prefill(rows)
        return Batch(list(rows), logits, cache, mask, next_pos, last_check=self.clock())


def _column_index(order, t):
    """A [rows, columns] index expanded over a [rows, heads, columns, head_dim] cache tensor for gather."""
    return order[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])


def chunk_end(done: int, total: int, tokens: int) -> int:
    """Where the next prefill chunk ends: the remaining prompt split into equal chunks of at most `tokens`.

    As few chunks as `tokens` allows, all of about the same size, so no chunk is a sliver and none pauses
    the running batch longer than the others: 1,027 tokens in chunks of at most 1,024 are 514 + 513, not
    1,024 + 3.

    >>> chunk_end(0, 1027, 1024), chunk_end(514, 1027, 1024)
    (514, 1027)
    >>> chunk_end(0, 1000, 256), chunk_end(0, 100, 256), chunk_end(0, 5, 0)
    (250, 100, 1)
    """
    remaining = total - done
    chunks = -(-remaining // max(1, tokens))
    return done + -(-remaining // max(1, chunks))
