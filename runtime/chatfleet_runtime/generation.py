"""Batched generation: one forward pass per step for every request of a dynamic batch.

A small decode loop over a Hugging Face causal LM instead of ``model.generate()`` so that each row keeps
its own settings and life: per-row max tokens, temperature, top-p and stop sequences, streaming of text
deltas, cancellation, and prefill that starts from a cached prefix (``PrefixCache``). Rows that finish
are dropped from the batch so the others run on.

Batch layout (one row per request; ``P`` = reused prefix length, ``n`` = prompt tokens still to compute)::

    [pad * (Pmax - P_i) | cached prefix (P_i) | pad * (Nmax - n_i) | new prompt tokens (n_i)]

Pads are masked out and positions are explicit, so rows with and without a cache hit share one prefill.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from chatfleet_runtime.prefix_cache import PrefixCache, session_key, system_key
from chatfleet_runtime.prompting import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    """One row of a batch: prompt ids and settings, plus optional streaming and cancellation hooks."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    system_len: int = 0
    use_prefix_cache: bool = True
    on_text: Callable[[str], None] | None = None
    is_cancelled: Callable[[], bool] | None = None


@dataclass
class GenerationResult:
    """What a row produced and why it ended (stop, length, cancelled, or error with `error` set)."""

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int = 0
    first_token_s: float | None = None
    total_s: float = 0.0
    error: str | None = None
    """Why this row failed (the other rows of its batch are unaffected); None on success."""
    error_kind: str = ""
    """`invalid` (the request's own settings or ids) or `internal` (a hook or the model failed)."""


class RowError(Exception):
    """One row's failure, handed to an in-flight completion callback; kind is invalid or internal."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


#: torch.Generator.manual_seed accepts seeds in this range (inclusive); anything else raises.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def request_problem(request: GenerationRequest, vocab_size: int) -> str | None:
    """Why a row cannot run (checked per row, so a bad row never fails its batch), or None.

    >>> request_problem(GenerationRequest([1, 2], SamplingParams(seed=2**64)), 100)
    'seed: 18446744073709551616 is outside -9223372036854775808..18446744073709551615'
    """
    p = request.params
    ids = request.prompt_ids
    if not ids:
        return "prompt_ids: must not be empty"
    bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        return f"prompt_ids: token {bad!r:.20} is outside 0..{vocab_size - 1}"
    if not isinstance(p.max_new_tokens, int) or p.max_new_tokens < 1:
        return f"max_tokens: {p.max_new_tokens!r:.20} must be at least 1"
    if not isinstance(p.temperature, (int, float)) or not math.isfinite(p.temperature) or p.temperature < 0:
        return f"temperature: {p.temperature!r:.20} must be a finite number >= 0"
    if not isinstance(p.top_p, (int, float)) or not 0 < p.top_p <= 1:
        return f"top_p: {p.top_p!r:.20} must be in (0, 1]"
    for name, value in (("presence_penalty", p.presence_penalty), ("frequency_penalty", p.frequency_penalty)):
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{name}: {value!r:.20} must be a finite number"
    for token, bias in p.logit_bias:
        if not isinstance(token, int) or not 0 <= token < vocab_size:
            return f"logit_bias: token {token!r:.20} is outside 0..{vocab_size - 1}"
        if not isinstance(bias, (int, float)) or not math.isfinite(bias):
            return f"logit_bias[{token}]: {bias!r:.20} must be a finite number"
    if p.seed is not None and (
        isinstance(p.seed, bool) or not isinstance(p.seed, int) or not SEED_MIN <= p.seed <= SEED_MAX
    ):
        return f"seed: {p.seed!r:.40} is outside {SEED_MIN}..{SEED_MAX}"
    return None


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas without splitting multi-byte characters."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_id: int) -> str:
        """Append a token and return the newly complete text (may be empty)."""
        return self.extend([token_id])

    def extend(self, token_ids: Sequence[int]) -> str:
        """Append tokens and return the newly complete text (may be empty)."""
        self.ids.extend(token_ids)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        new = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return new[len(prefix) :]
        return ""


class StopMatcher:
    """Finds stop sequences in streamed text and holds back text that could still begin one.

    >>> m = StopMatcher(("END",))
    >>> m.feed("hello E"), m.feed("N"), m.feed("D and more")
    ('hello ', '', '')
    >>> m.stopped, m.text
    (True, 'hello ')
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add a delta; return the text now safe to emit."""
        if self.stopped:
            return ""
        self.text += delta
        if not self.stops:
            out, self.emitted = self.text[self.emitted :], len(self.text)
            return out
        start = max(0, self.emitted - max(len(s) for s in self.stops))
        cut = min((i for i in (self.text.find(s, start) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.stopped = True
            out, self.emitted = self.text[self.emitted :], len(self.text)
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        safe = len(self.text) - hold
        out = self.text[self.emitted : safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return out

    def flush(self) -> str:
        """Emit whatever is held back (at the end of generation)."""
        out, self.emitted = self.text[self.emitted :], len(self.text)
        return out


class _Row:
    end: float | None = None

    def __init__(self, index: int, req: GenerationRequest, tokenizer, start: float):
        self.index = index
        self.req = req
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop = StopMatcher(req.params.stop)
        self.generated: list[int] = []
        self.finish: str | None = None
        self.cached = 0
        self.start = start
        self.first_token_s: float | None = None
        self.rng = None
        self.error: str | None = None
        self.error_kind = ""
        self.pending: list[int] = []
        self.unsent = ""
        self.last_sent: float | None = None

    def flush_tokens(self) -> None:
        """Detokenize pending tokens and run them through the stop matcher."""
        if self.pending:
            self.unsent += self.stop.feed(self.detok.extend(self.pending))
            self.pending = []

    def send(self, now: float, interval_s: float, force: bool = False) -> None:
        """Stream unsent text: the first piece at once, then at most once per interval, all of it when forced."""
        if self.req.on_text is None or not self.unsent:
            return
        if force or self.last_sent is None or now - self.last_sent >= interval_s:
            text, self.unsent, self.last_sent = self.unsent, "", now
            self.req.on_text(text)


@dataclass
class _Batch:
    """A running batch: rows, pending logits, KV cache, attention mask and next positions."""

    rows: list[_Row]
    logits: object
    cache: object
    mask: object
    next_pos: object
    last_check: float = 0.0
    step: int = 0


class BatchGenerator:
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
        self.stats = {"batches": 0, "rows": 0, "tokens": 0}

    # ---- public -------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for every request in one batched loop; returns results in request order."""
        start = self.clock()
        rows = [self.new_row(i, r, start) for i, r in enumerate(requests)]
        if not rows:
            return []
        self.stats["batches"] += 1
        self.stats["rows"] += len(rows)
        live = [row for row in rows if row.error is None]
        if live:
            with self.torch.inference_mode():
                self._run(live)
        return [self.result(row) for row in rows]

    # ---- internals ----------------------------------------------------------------------------

    def _lookup(self, row: _Row):
        cache, req = self.prefix_cache, row.req
        if cache is None or not req.use_prefix_cache:
            return None
        keys = []
        if req.session_id:
            keys.append(session_key(req.session_id))
        if req.system_len > 0:
            keys.append(system_key(req.prompt_ids[: req.system_len]))
        return cache.lookup(req.prompt_ids, keys) if keys else None

    def _prefill(self, rows: list[_Row]):
        """Build the padded batch (reusing cached prefixes) and run the prompt forward pass."""
        torch = self.torch
        from transformers import DynamicCache

        hits = [self._lookup(row) for row in rows]
        past_lens = [h.length if h else 0 for h in hits]
        for row, p in zip(rows, past_lens, strict=True):
            row.cached = p
        new_ids = [row.req.prompt_ids[p:] for row, p in zip(rows, past_lens, strict=True)]
        pmax, nmax, bsz = max(past_lens), max(len(n) for n in new_ids), len(rows)
        cache = DynamicCache(config=self.model.config)
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
            cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)
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
        return out.logits[:, -1, :], out.past_key_values, mask, next_pos

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

    def _store_session(self, row: _Row, cache, mask, b: int) -> None:
        if self.prefix_cache is None or not row.req.session_id or not row.req.use_prefix_cache:
            return
        # The cache holds the prompt and every generated token but the last (never fed back).
        ids = list(row.req.prompt_ids) + row.generated[:-1]
        layers = self._row_kv(cache, mask, b)
        if layers and layers[0][0].shape[2] == len(ids):
            self.prefix_cache.put(session_key(row.req.session_id), ids, layers)

    def _sample(self, logits, rows: list[_Row]):
        torch = self.torch
        logits = logits.float()
        if self.suppress is not None:
            logits[:, self.suppress] = float("-inf")
        for i, row in enumerate(rows):
            p = row.req.params
            if p.logit_bias:
                ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=logits.device)
                bias = torch.tensor([b for _, b in p.logit_bias], dtype=logits.dtype, device=logits.device)
                logits[i, ids] += bias
            if row.generated and (p.presence_penalty or p.frequency_penalty):
                # OpenAI's penalties over the tokens generated so far: logit -= count * frequency
                # + (count > 0) * presence, e.g. a token seen twice, 0.5 and 0.2 -> logit - 1.2.
                seen = torch.tensor(row.generated, dtype=torch.long, device=logits.device)
                counts = torch.bincount(seen, minlength=logits.shape[1])[: logits.shape[1]].to(logits.dtype)
                logits[i] -= counts * p.frequency_penalty + (counts > 0).to(logits.dtype) * p.presence_penalty
        out = torch.argmax(logits, dim=-1)
        for i, row in enumerate(rows):
            p = row.req.params
            if p.temperature <= 0:
                continue
            try:  # one row's sampling trouble fails that row only
                probs = torch.softmax(logits[i] / p.temperature, dim=-1)
                if p.top_p < 1.0:
                    sorted_p, order = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sorted_p, 0) - sorted_p < p.top_p
                    keep[0] = True
                    filtered = torch.zeros_like(probs)
                    filtered[order[keep]] = sorted_p[keep]
                    probs = filtered / filtered.sum()
                out[i] = torch.multinomial(probs, 1, generator=row.rng)[0]
            except Exception as exc:
                log.warning("sampling failed for one row: %s", exc)
                self._fail(row, "internal", f"sampling failed: {exc}")
        return out.tolist()

    @staticmethod
    def _fail(row: _Row, kind: str, message: str) -> None:
        """Mark one row failed (it leaves the batch at the next step; the others run on)."""
        if row.error is None:
            row.error, row.error_kind, row.finish = message, kind, "error"

    def _run(self, rows: list[_Row]) -> None:
        batch = self.start_isolated(rows)
        while batch is not None:
            try:
                batch, _ = self._step(batch)
            except Exception as exc:  # the shared forward pass failed: no row can go on
                log.exception("decode step failed")
                for row in batch.rows:
                    self._fail(row, "internal", f"generate failed: {exc}")
                batch = None

    def _start(self, rows: list[_Row]) -> _Batch:
        """Prefill rows into a new batch (logits pending for the first sampling)."""
        logits, cache, mask, next_pos = self._prefill(rows)
        return _Batch(list(rows), logits, cache, mask, next_pos, last_check=self.clock())

    def start_isolated(self, rows: list[_Row]) -> _Batch | None:
        """Prefill rows together; if that fails, prefill each alone so only the culprit rows fail.

        Rows that fail alone are marked (`row.error`); the others are merged into one batch. Returns
        None when no row could start.
        """
        try:
            return self._start(rows)
        except Exception as exc:
            if len(rows) == 1:
                log.warning("prefill failed for one row: %s", exc)
                self._fail(rows[0], "internal", f"prefill failed: {exc}")
                return None
        batch: _Batch | None = None
        for row in rows:
            one = self.start_isolated([row])
            if one is not None:
                batch = one if batch is None else self._merge(batch, one)
        return batch

    def _merge(self, a: _Batch, b: _Batch) -> _Batch:
        """Join two batches between steps: left-pad the shorter cache (masked), concatenate rows.

        Positions are explicit per row, so padding on the left changes nothing for the running rows.
        """
        torch = self.torch
        from transformers import DynamicCache

        la, lb = a.mask.shape[1], b.mask.shape[1]
        width = max(la, lb)

        def pad(t, n: int, dim: int):
            if n == 0:
                return t
            shape = list(t.shape)
            shape[dim] = n
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        layers = [
            (
                torch.cat([pad(x.keys, width - la, 2), pad(y.keys, width - lb, 2)]),
                torch.cat([pad(x.values, width - la, 2), pad(y.values, width - lb, 2)]),
            )
            for x, y in zip(a.cache.layers, b.cache.layers, strict=True)
        ]
        return _Batch(
            a.rows + b.rows,
            torch.cat([a.logits, b.logits]),
            DynamicCache(ddp_cache_data=layers, config=self.model.config),
            torch.cat([pad(a.mask, width - la, 1), pad(b.mask, width - lb, 1)]),
            torch.cat([a.next_pos, b.next_pos]),
            last_check=min(a.last_check, b.last_check),
            step=a.step,
        )

    def _step(self, batch: _Batch) -> tuple[_Batch | None, list[_Row]]:
        """Sample one token per row, finish rows, drop them, run the next forward; returns finished rows."""
        torch = self.torch
        active, logits, cache, mask, next_pos = (
            batch.rows,
            batch.logits,
            batch.cache,
            batch.mask,
            batch.next_pos,
        )
        tokens = self._sample(logits, active)
        now = self.clock()
        # is_cancelled() is an IPC round trip in Triton: ask at most every cancel_check_interval_s.
        check_cancel = batch.step == 0 or now - batch.last_check >= self.cancel_check_interval_s
        if check_cancel:
            batch.last_check = now
        keep: list[int] = []
        finished: list[_Row] = []
        # Per-row chunk interval, stretched with the batch so the whole batch sends at most
        # max_chunks_per_s stream chunks (each one costs IPC, gRPC and SSE work downstream).
        interval = max(self.stream_interval_s, len(active) / self.max_chunks_per_s)
        for b, (row, tok) in enumerate(zip(active, tokens, strict=True)):
            if row.error is None:
                try:  # whatever one row's hooks or text do, the other rows run on
                    self._advance(row, tok, now, interval, check_cancel, cache, mask, b)
                except Exception as exc:
                    log.warning("row failed: %s", exc)
                    self._fail(row, "internal", f"{type(exc).__name__}: {exc}")
            if row.finish is None:
                keep.append(b)
                continue
            row.end = now
            finished.append(row)
        if not keep:
            return None, finished
        if len(keep) < len(active):
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            cache.batch_select_indices(index)
            mask, next_pos = mask[index], next_pos[index]
            active = [active[b] for b in keep]
            tokens = [tokens[b] for b in keep]
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(-1)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
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

    def _advance(self, row: _Row, tok: int, now: float, interval: float, check_cancel: bool, cache, mask, b):
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
            row.flush_tokens()
            row.unsent += row.stop.flush()
            row.send(now, interval, force=True)
        self._store_session(row, cache, mask, b)

    def result(self, row: _Row) -> GenerationResult:
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

    def new_row(self, index: int, request: GenerationRequest, start: float) -> _Row:
        """Wrap a request as a batch row (seeded generator when the request asks for one)."""
        row = _Row(index, request, self.tokenizer, start)
        problem = request_problem(request, self.vocab_size)
        if problem is not None:
            self._fail(row, "invalid", problem)
        elif request.params.seed is not None:
            try:
                row.rng = self.torch.Generator(device=self.device).manual_seed(request.params.seed)
            except Exception as exc:
                self._fail(row, "invalid", f"seed: {exc}")
        return row


class InflightEngine:
    """Continuous (in-flight) batching: new requests join the running batch at the next step.

    A background thread owns the batch. ``submit`` queues a request with a completion callback; between
    decode steps the thread prefills whatever arrived (up to ``max_rows`` rows in all) and merges it into
    the running batch, so a request never waits for a whole batch to finish. Used by the decoupled
    (streaming) model, whose responses are sent from this thread.
    """

    def __init__(
        self,
        generator: BatchGenerator,
        *,
        max_rows: int = 32,
        on_join: Callable[[int, int], None] | None = None,
    ):
        import queue
        import threading

        self.generator = generator
        # OpenMP thread counts are per OS thread: take the creating thread's setting into the engine's.
        self.threads = generator.torch.get_num_threads()
        self.max_rows = max(1, max_rows)
        self.on_join = on_join or (lambda rows, joined: None)
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chatfleet-inflight", daemon=True)
        self._thread.start()

    def submit(
        self, request: GenerationRequest, on_done: Callable[[GenerationResult | None, Exception | None], None]
    ) -> None:
        """Queue a request; on_done(result, None) or on_done(None, error) is called exactly once."""
        self._queue.put((request, on_done, self.generator.clock()))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (requests still running are answered with an error)."""
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        import queue

        torch = self.generator.torch
        torch.set_num_threads(self.threads)
        batch: _Batch | None = None
        callbacks: dict[int, Callable] = {}
        while not self._stop.is_set():
            joining = []
            room = self.max_rows - (len(batch.rows) if batch else 0)
            try:
                while len(joining) < room:
                    item = self._queue.get(block=batch is None and not joining, timeout=0.5)
                    if item is None:
                        break
                    joining.append(item)
            except queue.Empty:
                pass
            try:
                with torch.inference_mode():
                    if joining:
                        rows = []
                        for request, on_done, start in joining:
                            row = self.generator.new_row(0, request, start)
                            if row.error is not None:  # refused alone, before it can touch the batch
                                self._finish(on_done, row)
                                continue
                            callbacks[id(row)] = on_done
                            rows.append(row)
                        new = self.generator.start_isolated(rows) if rows else None
                        for row in rows:
                            if row.error is not None:
                                self._finish(callbacks.pop(id(row)), row)
                        if new is not None:
                            batch = new if batch is None else self.generator._merge(batch, new)
                            self.on_join(len(batch.rows), len(new.rows))
                    if batch is None:
                        continue
                    batch, finished = self.generator._step(batch)
                for row in finished:
                    self._finish(callbacks.pop(id(row)), row)
            except Exception as exc:  # answer every affected request, then carry on with an empty batch
                log.exception("in-flight batch failed")
                for key in list(callbacks):
                    self._done(callbacks.pop(key), None, exc)
                batch = None
        for key in list(callbacks):
            self._done(callbacks.pop(key), None, RuntimeError("engine stopped"))

    def _finish(self, callback, row: _Row) -> None:
        """Answer a finished row: its result, or a RowError when the row failed."""
        result = self.generator.result(row)
        if result.error is not None:
            self._done(callback, None, RowError(result.error_kind, result.error))
        else:
            self._done(callback, result, None)

    @staticmethod
    def _done(callback, result, error) -> None:
        try:
            callback(result, error)
        except Exception:
            log.exception("completion callback failed")


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
