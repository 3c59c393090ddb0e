"""Batched generation: one forward pass per step for every request of a dynamic batch.

A small decode loop over a Hugging Face causal LM instead of ``model.generate()`` so that each row keeps
its own settings and life: per-row max tokens, temperature, top-p and stop sequences, streaming of text
deltas, cancellation, and prefill that starts from a cached prefix (``PrefixCache``). Rows that finish
are dropped from the batch so the others run on.

The public steps, which ``generate`` runs to the end for one dynamic batch and ``InflightEngine``
interleaves with arrivals: ``new_row`` (a request checked alone), ``start`` (prefill rows into a batch),
``merge`` (join two batches between steps), ``step`` (one token for every row; finished rows leave)
and ``result``.

The prefill, its batch layout and the chunked prefill's steps (``begin_prefill``, ``prefill_chunk``) are
in ``chatfleet_runtime.engine.prefill`` (``PrefillSteps``, this class's base); here the decode loop, the
batch joined and narrowed between steps, and each row's tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from chatfleet_runtime.engine.admission import kv_bytes_per_position
from chatfleet_runtime.engine.prefill import PrefillSteps
from chatfleet_runtime.engine.prefix_cache import PrefixCache
from chatfleet_runtime.engine.rows import (
    Batch,
    GenerationRequest,
    GenerationResult,
    Row,
    request_problem,
)
from chatfleet_runtime.engine.sampling import sample

log = logging.getLogger(__name__)


class BatchGenerator(PrefillSteps):
    """Runs batches of GenerationRequests on one model; owns the prefix cache."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        prefix_cache: PrefixCache | None = None,
        suppress_special_tokens: bool = True,
        cancel_check_interval_s: float = 0.05,
        stream_interval_s: float = 0.0,
        max_chunks_per_s: float = 500.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        import torch

        self.torch = torch
        self.model = model
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache
        self.cancel_check_interval_s = cancel_check_interval_s
        self.stream_interval_s = stream_interval_s
        self.max_chunks_per_s = max(1.0, max_chunks_per_s)
        self.clock = clock
        self.device = _device_of(model)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids = sorted(eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        vocab = self.vocab_size = _vocab_size(model)
        suppress = [i for i in tokenizer.all_special_ids if i not in eos_ids and i < vocab]
        self.suppress = (
            torch.tensor(suppress, dtype=torch.long, device=self.device)
            if suppress_special_tokens and suppress
            else None
        )
        self.num_layers = model.config.get_text_config().num_hidden_layers
        from chatfleet_runtime.engine import kvcache

        self._kv = kvcache
        #: Counters since start. ``attended``: KV positions the decode steps attended over, rows x width summed
        #: over steps; per generated token it is the work a step does beyond the weights, and it stays flat
        #: while the cache is bounded by the live rows (it grows with the batch's age when it is not).
        #: ``steps``: decode steps run; tokens per step is how full the running batch is kept.
        self.stats = {"batches": 0, "rows": 0, "tokens": 0, "attended": 0, "steps": 0}

    # ---- public -------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for every request in one batched loop; returns results in request order."""
        start = self.clock()
        rows = [self.new_row(r, start) for r in requests]
        if not rows:
            return []
        self.stats["batches"] += 1
        self.stats["rows"] += len(rows)
        live = [row for row in rows if row.error is None]
        if live:
            with self.torch.inference_mode():
                self._run(live)
        return [self.result(row) for row in rows]

    def kv_bytes_per_position(self) -> int:
        """Bytes one position of one row takes in the KV cache (every layer's keys and values)."""
        config = self.model.config.get_text_config()
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        dtype = next((t.dtype for t in (*self.model.parameters(), *self.model.buffers())), self.torch.float32)
        if not dtype.is_floating_point:  # int8 weights: the cache is in the compute dtype
            dtype = self.torch.float32
        size = self.torch.empty((), dtype=dtype).element_size()
        return kv_bytes_per_position(self.num_layers, kv_heads, head_dim, size)

    def new_row(self, request: GenerationRequest, start: float) -> Row:
        """Wrap a request as a batch row (seeded generator when the request asks for one)."""
        row = Row(request, self.tokenizer, start)
        problem = request_problem(request, self.vocab_size)
        if problem is not None:
            row.fail("invalid", problem)
        elif request.params.seed is not None:
            try:
                row.rng = self.torch.Generator(device=self.device).manual_seed(request.params.seed)
            except Exception as exc:
                row.fail("invalid", f"seed: {exc}")
        return row

    def start(self, rows: list[Row]) -> Batch | None:
        """Prefill rows into a new batch; if that fails, prefill each alone so only the culprit rows fail.

        Rows that fail alone are marked (`row.error`); the others are merged into one batch. Returns
        None when no row could start.
        """
        try:
            return self._start_together(rows)
        except Exception as exc:
            if len(rows) == 1:
                log.warning("prefill failed for one row: %s", exc)
                rows[0].fail("internal", f"prefill failed: {exc}")
                return None
        batch: Batch | None = None
        for row in rows:
            one = self.start([row])
            if one is not None:
                batch = one if batch is None else self.merge(batch, one)
        return batch

    def merge(self, a: Batch, b: Batch) -> Batch:
        """Join two batches between steps: left-pad the shorter cache (masked), concatenate rows.

        Positions are explicit per row, so padding on the left changes nothing for the running rows.
        Consumes both: their caches' tensors are released layer by layer.
        """
        torch, kvcache = self.torch, self._kv
        la, lb = a.mask.shape[1], b.mask.shape[1]
        width = max(la, lb)
        room = self._room(a.rows + b.rows, width)

        def pad(t, n: int, dim: int):
            if n == 0:
                return t
            shape = list(t.shape)
            shape[dim] = n
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        layers = []
        for x, y in zip(a.cache.layers, b.cache.layers, strict=True):
            if x.keys.shape[2] == la and y.keys.shape[2] == lb:  # one column per position: into roomy buffers
                layers.append(
                    (
                        kvcache.joined(x.keys, y.keys, width, room),
                        kvcache.joined(x.values, y.values, width, room),
                    )
                )
            else:
                layers.append(
                    (
                        torch.cat([pad(x.keys, width - la, 2), pad(y.keys, width - lb, 2)]),
                        torch.cat([pad(x.values, width - la, 2), pad(y.values, width - lb, 2)]),
                    )
                )
            # Both batches are consumed: drop each old layer as soon as its merged copy exists, so memory
            # peaks at the merged cache plus one layer, not at the old and the merged caches together
            # (the KV budget leaves the device room for a layer, not for a second cache).
            kvcache.release(x)
            kvcache.release(y)
        return Batch(
            a.rows + b.rows,
            torch.cat([a.logits, b.logits]),
            kvcache.adopted(self.model.config, layers, width),
            torch.cat([pad(a.mask, width - la, 1), pad(b.mask, width - lb, 1)]),
            torch.cat([a.next_pos, b.next_pos]),
            last_check=min(a.last_check, b.last_check),
            step=a.step,
        )

    def step(self, batch: Batch) -> tuple[Batch | None, list[Row]]:
        """Sample one token per row, finish rows, drop them, run the next forward; returns finished rows."""
        torch = self.torch
        active, logits, cache, mask, next_pos = (
            batch.rows,
            batch.logits,
            batch.cache,
            batch.mask,
            batch.next_pos,
        )
        tokens = sample(torch, logits, active, self.suppress)
        now = self.clock()
        # is_cancelled() is an IPC round trip in Triton: ask at most every cancel_check_interval_s.
        check_cancel = batch.step == 0 or now - batch.last_check >= self.cancel_check_interval_s
        if check_cancel:
            batch.last_check = now
        keep: list[int] = []
        finished: list[Row] = []
        # Per-row chunk interval, stretched with the batch so the whole batch sends at most
        # max_chunks_per_s stream chunks (each one costs IPC, gRPC and SSE work downstream).
        interval = max(self.stream_interval_s, len(active) / self.max_chunks_per_s)
        for b, (row, tok) in enumerate(zip(active, tokens, strict=True)):
            if row.error is None:
                try:  # whatever one row's hooks or text do, the other rows run on
                    self._advance(row, tok, now, interval, check_cancel, cache, mask, b)
                except Exception as exc:
                    log.warning("row failed: %s", exc)
                    row.fail("internal", f"{type(exc).__name__}: {exc}")
            if row.finish is None:
                keep.append(b)
                continue
            row.end = now
            finished.append(row)
        if not keep:
            return None, finished
        if len(keep) < len(active):
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            active = [active[b] for b in keep]
            mask, next_pos = self._select(cache, mask, index, active), next_pos[index]
            tokens = [tokens[b] for b in keep]
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(-1)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        self._kv.set_room(cache, self._room(active, mask.shape[1]))
        self.stats["attended"] += mask.shape[0] * mask.shape[1]
        self.stats["steps"] += 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=next_pos.unsqueeze(-1),
            past_key_values=cache,
            use_cache=True,
        )
        batch.rows, batch.logits, batch.cache, batch.mask = (
            active,
            out.logits[:, -1, :],
            out.past_key_values,
            mask,
        )
        batch.next_pos, batch.step = next_pos + 1, batch.step + 1
        return batch, finished

    def result(self, row: Row) -> GenerationResult:
        """The GenerationResult of a finished row."""
        if row.error is not None:
            return GenerationResult(
                text="",
                token_ids=[],
                finish_reason="error",
                prompt_tokens=len(row.req.prompt_ids),
                total_s=(row.end or self.clock()) - row.start,
                error=row.error,
                error_kind=row.error_kind,
            )
        return GenerationResult(
            text=row.stop.text,
            token_ids=row.generated,
            finish_reason=row.finish or "length",
            prompt_tokens=len(row.req.prompt_ids),
            cached_tokens=row.cached,
            first_token_s=row.first_token_s,
            total_s=(row.end or self.clock()) - row.start,
        )

    # ---- internals ----------------------------------------------------------------------------

    def _room(self, rows: list[Row], width: int) -> int:
        """Spare columns for a cache `width` wide: up to ``kvcache.ROOM``, never past the widest these rows
        can make it (prompt + max tokens), which is what the KV budget counted when they joined."""
        widest = max(len(r.req.prompt_ids) + r.req.params.max_new_tokens for r in rows)
        return max(0, min(self._kv.ROOM, widest - width))

    def _select(self, cache, mask, index, rows: list[Row]):
        """Keep the rows at `index` and drop the leading columns none of them attends to; returns the mask.

        Left-padded rows share one width, so the columns before the oldest live row's first token hold
        only the rows that left. Dropping them keeps the width at the longest live row's span, however
        long the batch has run: masks 0011 / 1111 / 0111, the second row leaves -> 0011 / 0111 -> column
        0 is unused -> 011 / 111 (width 4 -> 3).
        """
        mask = mask[index]
        first = int(mask.any(dim=0).int().argmax())
        # A layer that is not one column per position (a sliding window): select rows only.
        if any(layer.keys.shape[-2] != mask.shape[1] for layer in cache.layers):
            cache.batch_select_indices(index)
            return mask
        mask = mask[:, first:].contiguous()
        # One copy into buffers with room: the next steps write their columns in place.
        self._kv.select(cache, index, first, self._room(rows, mask.shape[1]))
        return mask

    def _run(self, rows: list[Row]) -> None:
        batch = self.start(rows)
        while batch is not None:
            try:
                batch, _ = self.step(batch)
            except Exception as exc:  # the shared forward pass failed: no row can go on
                log.exception("decode step failed")
                for row in batch.rows:
                    row.fail("internal", f"generate failed: {exc}")
                batch = None

    def _advance(self, row: Row, tok: int, now: float, interval: float, check_cancel: bool, cache, mask, b):
        """Take one sampled token into a row: text, stop sequences, limits, streaming, cancellation."""
        if row.first_token_s is None:
            row.first_token_s = now - row.start
        row.generated.append(tok)
        self.stats["tokens"] += 1
        if tok in self.eos_ids:
            row.finish = "stop"
        else:
            row.pending.append(tok)
            # Text is needed now only for stop sequences or a due stream chunk; else it waits.
            streaming_due = row.req.on_text is not None and (
                row.last_sent is None or now - row.last_sent >= interval
            )
            if row.stop.stops or streaming_due:
                row.flush_tokens()
            if row.stop.stopped:
                row.finish = "stop"
            elif len(row.generated) >= row.req.params.max_new_tokens:
                row.finish = "length"
            else:
                row.send(now, interval)
        if row.finish is None and row.req.is_cancelled and check_cancel:
            try:
                if row.req.is_cancelled():
                    row.finish = "cancelled"
            except Exception:  # a broken hook must not break the batch
                log.exception("is_cancelled hook failed")
        if row.finish is None:
            return
        if row.finish != "cancelled":
            row.flush_tokens(final=True)
            row.unsent += row.stop.flush()
            row.send(now, interval, force=True)
        self._store_session(row, cache, mask, b)


def _device_of(model):
    """The device of the model's first parameter or buffer (int8 models may hold only buffers)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    import torch

    return torch.device("cpu")


def _vocab_size(model) -> int:
    """Rows of the output projection (works for plain, tied and quantized lm_heads alike)."""
    head = model.get_output_embeddings()
    weight = head.weight() if callable(getattr(head, "weight", None)) else getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    out = getattr(head, "out_features", None)
    return int(out) if out is not None else int(model.config.get_text_config().vocab_size)
