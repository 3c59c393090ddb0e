"""Continuous (in-flight) batching over ``BatchGenerator``'s public steps: new_row, start, merge, step."""

from __future__ import annotations

import logging
from collections.abc import Callable

from chatfleet_runtime.engine.admission import batch_kv_bytes, plan_admission
from chatfleet_runtime.engine.generation import BatchGenerator
from chatfleet_runtime.engine.rows import Batch, GenerationRequest, GenerationResult, Prefill, Row, RowError

log = logging.getLogger(__name__)


class InflightEngine:
    """Continuous (in-flight) batching: new requests join the running batch at the next step.

    A background thread owns the batch. ``submit`` queues a request with a completion callback; between
    decode steps the thread prefills whatever arrived (up to ``max_rows`` rows in all) and merges it into
    the running batch, so a request never waits for a whole batch to finish. Used by the (decoupled) chat
    model for streamed and non-streamed requests alike, whose responses are sent from this thread.

    With a KV budget (``kv_budget_bytes``; ``ChatService`` passes the one ``kvsizing`` resolved at load, and
    its row limit as ``max_rows``), a request joins only while the batch's cache at its widest
    stays within it (``admission.plan_admission``); the others wait in order, and are refused with a
    ``RowError`` of kind ``overloaded`` past ``max_waiting`` waiting or ``max_wait_s`` seconds.

    With ``prefill_chunk_tokens``, a prompt longer than that is prefilled in chunks of that many tokens,
    one chunk between two decode steps, and joins the batch when its last chunk is done: a long prompt
    arriving delays the running rows' next token by one chunk's work at most, never by its whole length.
    """

    def __init__(
        self,
        generator: BatchGenerator,
        *,
        max_rows: int = 32,
        on_join: Callable[[int, int], None] | None = None,
        kv_budget_bytes: int = 0,
        max_waiting: int | None = None,
        max_wait_s: float = float("inf"),
        prefill_chunk_tokens: int = 0,
    ):
        import queue
        import threading

        self.generator = generator
        # OpenMP thread counts are per OS thread: take the creating thread's setting into the engine's.
        self.threads = generator.torch.get_num_threads()
        self.max_rows = max(1, max_rows)
        self.on_join = on_join or (lambda rows, joined: None)
        self.kv_budget_bytes = kv_budget_bytes
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self.per_position = generator.kv_bytes_per_position()
        self.prefill_chunk_tokens = prefill_chunk_tokens
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
        batch: Batch | None = None
        callbacks: dict[int, Callable] = {}
        waiting: list = []
        prefilling: list[Prefill] = []
        chunk = self.prefill_chunk_tokens
        while not self._stop.is_set():
            try:
                while True:  # take every arrival (blocking only while there is nothing to do)
                    idle = batch is None and not waiting and not prefilling
                    item = self._queue.get(block=idle, timeout=0.5)
                    if item is None:
                        break
                    waiting.append(item)
            except queue.Empty:
                pass
            live = [*(batch.rows if batch else []), *(p.row for p in prefilling)]
            joining, waiting = self._admit(live, waiting)
            try:
                with torch.inference_mode():
                    new: Batch | None = None
                    if joining:
                        rows = []
                        for request, on_done, start in joining:
                            row = self.generator.new_row(request, start)
                            if row.error is not None:  # refused alone, before it can touch the batch
                                self._finish(on_done, row)
                                continue
                            callbacks[id(row)] = on_done
                            if chunk and len(request.prompt_ids) > chunk:
                                prefilling.append(self.generator.begin_prefill(row))
                            else:
                                rows.append(row)
                        # Rows of like length prefill together: one long prompt never pads the short ones.
                        for group in length_groups([len(r.req.prompt_ids) for r in rows]):
                            one = self.generator.start([rows[i] for i in group])
                            if one is not None:
                                new = one if new is None else self.generator.merge(new, one)
                        for row in rows:
                            if row.error is not None:
                                self._finish(callbacks.pop(id(row)), row)
                    if new is not None:
                        batch = new if batch is None else self.generator.merge(batch, new)
                        self.on_join(len(batch.rows), len(new.rows))
                    if prefilling:  # one chunk of the oldest long prompt between two decode steps
                        new = self._prefill_chunk(prefilling, callbacks)
                        if new is not None:
                            batch = new if batch is None else self.generator.merge(batch, new)
                            self.on_join(len(batch.rows), len(new.rows))
                    if batch is None:
                        continue
                    batch, finished = self.generator.step(batch)
                for row in finished:
                    self._finish(callbacks.pop(id(row)), row)
            except Exception as exc:  # answer every affected request, then carry on with an empty batch
                log.exception("in-flight batch failed")
                for key in list(callbacks):
                    self._done(callbacks.pop(key), None, exc)
                batch, prefilling = None, []
        for key in list(callbacks):
            self._done(callbacks.pop(key), None, RuntimeError("engine stopped"))
        for _, on_done, _ in waiting:
            self._done(on_done, None, RuntimeError("engine stopped"))

    def _prefill_chunk(self, prefilling: list[Prefill], callbacks: dict) -> Batch | None:
        """Run one chunk of the oldest chunked prefill; its one-row batch once its prompt is done."""
        head = prefilling[0]
        try:
            new = self.generator.prefill_chunk(head, self.prefill_chunk_tokens)
        except Exception as exc:  # this row's prompt failed: it alone is answered with the error
            log.warning("chunked prefill failed for one row: %s", exc)
            head.row.fail("internal", f"prefill failed: {exc}")
            prefilling.pop(0)
            self._finish(callbacks.pop(id(head.row)), head.row)
            return None
        if new is not None:
            prefilling.pop(0)
        return new

    def _admit(self, rows: list[Row], waiting: list) -> tuple[list, list]:
        """Split the waiting requests into those that join now and those that wait; refuse the rest."""
        live = [_span(row.req) for row in rows]
        plan = plan_admission(
            live,
            [(_span(request), start) for request, _, start in waiting],
            per_position=self.per_position,
            budget=self.kv_budget_bytes,
            room=self.max_rows,
            max_waiting=len(waiting) if self.max_waiting is None else self.max_waiting,
            max_wait_s=self.max_wait_s,
            now=self.generator.clock(),
        )
        for i in plan.refuse:
            request, on_done, _ = waiting[i]
            span = _span(request)
            alone = batch_kv_bytes([span], self.per_position)
            if alone > self.kv_budget_bytes:
                message = (
                    f"kv budget: this request ({span} positions: prompt + max_tokens) alone needs {alone} "
                    f"bytes of KV cache, over the budget of {self.kv_budget_bytes}"
                )
            else:
                message = (
                    f"kv budget: {len(live)} running requests hold the KV budget ({self.kv_budget_bytes} "
                    f"bytes) and {len(waiting)} wait; retry later"
                )
            self._done(on_done, None, RowError("overloaded", message))
        gone = set(plan.admit) | set(plan.refuse)
        return [waiting[i] for i in plan.admit], [w for i, w in enumerate(waiting) if i not in gone]

    def _finish(self, callback, row: Row) -> None:
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


def _span(request: GenerationRequest) -> int:
    """The most positions a request's row can take: its prompt plus its max tokens (never raises: a bad
    request is refused alone when it joins)."""
    tokens = request.params.max_new_tokens
    return len(request.prompt_ids) + (tokens if isinstance(tokens, int) and tokens > 0 else 0)


def length_groups(lengths: list[int], max_padding: float = 0.25) -> list[list[int]]:
    """Indices of prompts grouped by length, so that padding is at most `max_padding` of a group's pass.

    A joint prefill pads every row to the longest: ten 30-token prompts joining with one 900-token prompt
    would compute 9,900 tokens for 1,200 real ones. Sorted by length, a group closes when adding the next
    (longer) prompt would make padding more than `max_padding` of the padded tokens.

    >>> length_groups([30, 900, 28, 32])
    [[2, 0, 3], [1]]
    >>> length_groups([])
    []
    """
    groups: list[list[int]] = []
    group: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        padded = lengths[i] * (len(group) + 1)  # the longest so far is this one (sorted)
        if group and padded - (real + lengths[i]) > max_padding * padded:
            groups.append(group)
            group, real = [], 0
        group.append(i)
        real += lengths[i]
    return [*groups, group] if group else groups
