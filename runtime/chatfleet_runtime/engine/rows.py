"""What a batch is made of: requests and results, a request's own checks, rows and the running batch.

A ``GenerationRequest`` becomes a ``Row`` when it joins a ``Batch``; a finished row becomes a
``GenerationResult``. A row that cannot run fails alone (``request_problem``, ``Row.fail``): the other
rows of its batch run on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from chatfleet_runtime.engine.textstream import IncrementalDetokenizer, StopMatcher
from chatfleet_runtime.prompting import SamplingParams


@dataclass
class GenerationRequest:
    """One row of a batch: prompt ids and settings, plus optional streaming and cancellation hooks."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    system_len: int = 0
    use_prefix_cache: bool = True
    on_text: Callable[[str, int, int], None] | None = None
    """Streaming: called with each text delta, the tokens generated so far and the prompt's tokens."""
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
    if isinstance(p.top_k, bool) or not isinstance(p.top_k, int) or p.top_k < 0:
        return f"top_k: {p.top_k!r:.20} must be an integer >= 0"
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


class Row:
    """One request inside a running batch: its tokens, text, stream state, timing and outcome."""

    end: float | None = None

    def __init__(self, req: GenerationRequest, tokenizer, start: float):
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

    def flush_tokens(self, final: bool = False) -> None:
        """Detokenize pending tokens and run them through the stop matcher (final: the held-back end too)."""
        if self.pending:
            self.unsent += self.stop.feed(self.detok.extend(self.pending))
            self.pending = []
        if final:
            self.unsent += self.stop.feed(self.detok.flush())

    def send(self, now: float, interval_s: float, force: bool = False) -> None:
        """Stream unsent text: the first piece at once, then at most once per interval, all of it when forced."""
        if self.req.on_text is None or not self.unsent:
            return
        if force or self.last_sent is None or now - self.last_sent >= interval_s:
            text, self.unsent, self.last_sent = self.unsent, "", now
            self.req.on_text(text, len(self.generated), len(self.req.prompt_ids))

    def fail(self, kind: str, message: str) -> None:
        """Mark the row failed (it leaves the batch at the next step; the others run on)."""
        if self.error is None:
            self.error, self.error_kind, self.finish = message, kind, "error"


@dataclass
class Batch:
    """A running batch: rows, pending logits, KV cache, attention mask and next positions."""

    rows: list[Row]
    logits: object
    cache: object
    mask: object
    next_pos: object
    last_check: float = 0.0
    step: int = 0


@dataclass
class Prefill:
    """A row whose prompt is computed in chunks between decode steps: its own KV cache, tokens done."""

    row: Row
    cache: object
    done: int = 0
