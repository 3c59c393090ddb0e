"""What a transformers user gets without a server: model.generate() in process, in static batches.

``StaticBatcher`` takes requests from concurrent clients (threads) and runs them as static batches: it
waits for a request, collects more for up to ``window_s`` after it or until ``max_batch`` are taken,
left-pads the prompts (with their attention mask) and runs ONE ``model.generate()`` for the batch, for as
many steps as its longest answer. Nothing joins a running batch: requests that arrive meanwhile wait for
it to end. ``max_batch=1`` is the one-at-a-time baseline (one ``generate()`` per request, first come
first served).

Each request asks for its own number of new tokens; EOS and the other special tokens are suppressed,
so every answer is exactly as long as asked (a random model would otherwise stop anywhere). The batch
runs for the longest; a row's answer counts as delivered at the step that produced its own last token,
as a streaming server would deliver it (the most a static batch can give its short answers), and its
client may send its next request then: that request waits in the queue for the running batch to end.
The time to the end of the batch (what a non-streaming client sees) is kept as ``batch_end``.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Prompts of at least this many tokens are batched apart from shorter ones (``length_groups``).
LONG_PROMPT_TOKENS = 256


@dataclass
class Job:
    """One request: its chat messages, the answer length asked, when it was submitted, where to report."""

    messages: list[dict[str, str]]
    length: int
    submitted: float
    report: Callable[[dict | Exception], None]
    sample: dict | None = field(default=None)
    """The measurements, once reported (its batch_end is filled in when the batch ends)."""


def collect_batch(
    jobs: queue.Queue, max_batch: int, window_s: float, clock: Callable[[], float] = time.perf_counter
) -> list:
    """Wait for one job, then take more until max_batch jobs or window_s after the first; [] means stop.

    A ``None`` in the queue stops the batcher: it is put back so a later call sees it too. E.g. with 3
    jobs waiting, max_batch 2 -> the first two at once, without waiting out the window.
    """
    first = jobs.get()
    if first is None:
        jobs.put(None)
        return []
    batch = [first]
    deadline = clock() + window_s
    while len(batch) < max_batch:
        try:
            job = jobs.get_nowait() if clock() >= deadline else jobs.get(timeout=deadline - clock())
        except queue.Empty:
            break
        if job is None:
            jobs.put(None)
            break
        batch.append(job)
    return batch


def row_sample(submitted: float, length: int, step_times: list[float], batch_end: float, batch: int) -> dict:
    """A row's measurements (seconds) from the batch's step times: step k (0-based) made token k + 1.

    E.g. submitted at 1.0, length 2, steps at [1.5, 1.6, 1.7], batch ended at 1.8 -> ttft 0.5,
    latency 0.6 (its second token), batch_end 0.8.
    """
    return {
        "ttft": step_times[0] - submitted,
        "latency": step_times[length - 1] - submitted,
        "batch_end": batch_end - submitted,
        "tokens": length,
        "batch": batch,
    }


def step_gaps(step_times: list[float], length: int) -> list[float]:
    """The gaps between a row's tokens (its inter-token latency as streamed), e.g. [1.5, 1.6, 1.8], 3 -> [0.1, 0.2]."""
    return [b - a for a, b in itertools.pairwise(step_times[:length])]


def length_groups(prompt_lengths: list[int], threshold: int = LONG_PROMPT_TOKENS) -> list[list[int]]:
    """Indices of a collected batch split into short and long prompts (each group one generate()).

    Left padding makes every row of a batch as long as its longest prompt: one ~1,000-token history would
    make 31 short questions cost 1,000 tokens each. E.g. [20, 1030, 25] -> [[0, 2], [1]]; [20, 25] -> [[0, 1]].
    """
    short = [i for i, n in enumerate(prompt_lengths) if n < threshold]
    long = [i for i, n in enumerate(prompt_lengths) if n >= threshold]
    return [g for g in (short, long) if g]


class StaticBatcher:
    """Static batches of model.generate() on a worker thread; clients call submit_and_wait concurrently."""

    def __init__(
        self, model, tokenizer, *, threads: int, max_batch: int, window_s: float, sampling: dict | None = None
    ):
        import torch

        self.torch, self.model, self.tokenizer = torch, model, tokenizer
        self.threads, self.max_batch, self.window_s = threads, max_batch, window_s
        # Greedy unless a temperature is given: {"temperature": 0.7, "top_p": 0.9} samples (top-k off).
        temperature = (sampling or {}).get("temperature", 0.0)
        self.sampling = (
            {"do_sample": True, "temperature": temperature, "top_p": sampling["top_p"], "top_k": 0}
            if temperature > 0
            else {"do_sample": False}
        )
        # Every special token, EOS included: answers end at their own length, never earlier.
        self.suppress = sorted(set(tokenizer.all_special_ids))
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._worker, name="static-batcher", daemon=True)
        self.thread.start()

    def submit_and_wait(self, messages: list[dict[str, str]], length: int) -> dict:
        """Queue one request for `length` new tokens and wait for its measurements."""
        box: queue.Queue = queue.Queue()
        self.jobs.put(Job(messages, length, time.perf_counter(), box.put))
        result = box.get()
        if isinstance(result, Exception):
            raise result
        return result

    def close(self) -> None:
        """Stop the worker (after the running batch)."""
        self.jobs.put(None)
        self.thread.join(30)

    def _worker(self) -> None:
        self.torch.set_num_threads(
            self.threads
        )  # OpenMP thread counts are per thread: set it where generate runs
        while batch := collect_batch(self.jobs, self.max_batch, self.window_s):
            lengths = [len(self._prompt_ids(job)) for job in batch]
            for group in length_groups(lengths):
                rows = [batch[i] for i in group]
                try:
                    self._run(rows)
                except Exception as exc:  # the clients see it; the worker takes the next batch
                    for job in rows:
                        if job.sample is None:
                            job.report(exc)

    def _prompt_ids(self, job: Job) -> list[int]:
        ids = self.tokenizer.apply_chat_template(job.messages, add_generation_prompt=True, tokenize=True)
        return ids if isinstance(ids, list) else ids["input_ids"]

    def _run(self, batch: list[Job]) -> None:
        """One generate() for the batch; each row reported at its own last token.

        The longest rows are reported last, after every earlier row's batch_end is filled in, so once
        every client has its answer every sample is complete.
        """
        from transformers.generation.streamers import BaseStreamer

        torch, tokenizer = self.torch, self.tokenizer
        steps: list[float] = []
        size, longest = len(batch), max(job.length for job in batch)

        class StepClock(BaseStreamer):
            """Times each decode step and reports the rows whose answer that step completed."""

            def __init__(self):
                self.prompt_seen = False

            def put(self, value):
                if not self.prompt_seen:  # the first call carries the prompt
                    self.prompt_seen = True
                    return
                steps.append(time.perf_counter())
                for job in batch:
                    if job.length == len(steps) < longest:
                        job.sample = row_sample(job.submitted, job.length, steps, steps[-1], size)
                        job.sample["gaps"] = step_gaps(steps, job.length)
                        job.report(job.sample)

            def end(self):
                pass

        texts = [
            tokenizer.apply_chat_template(job.messages, tokenize=False, add_generation_prompt=True)
            for job in batch
        ]
        inputs = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")  # left padding
        with torch.inference_mode():
            out = self.model.generate(
                **inputs,
                max_new_tokens=longest,
                **self.sampling,
                suppress_tokens=self.suppress,
                streamer=StepClock(),
                pad_token_id=tokenizer.pad_token_id,
            )
        generated = out[:, inputs["input_ids"].shape[1] :]
        tokenizer.batch_decode(
            [row[: job.length] for row, job in zip(generated, batch, strict=True)], skip_special_tokens=True
        )
        end = time.perf_counter()
        if generated.shape[1] != longest:
            raise RuntimeError(f"generate() made {generated.shape[1]} tokens, {longest} asked")
        for job in batch:
            if job.sample is not None:  # reported early: its client holds this dict already
                job.sample["batch_end"] = end - job.submitted
        for job in batch:
            if job.sample is None:
                job.sample = row_sample(job.submitted, job.length, steps, end, size)
                job.sample["gaps"] = step_gaps(steps, job.length)
                job.report(job.sample)


def closed_loop(submit: Callable[[int], dict], concurrency: int, requests: int) -> tuple[list[dict], float]:
    """`concurrency` clients (threads) working through `requests` requests: (samples, wall seconds).

    Each client sends its next request as soon as its last one is answered, so `concurrency` requests
    are in flight until the last ones drain. ``submit(k)`` sends request k (0-based, in the order taken)
    and returns its measurements.
    """
    samples: list[dict] = []
    errors: list[Exception] = []
    lock = threading.Lock()
    taken = iter(range(requests))

    def client() -> None:
        try:
            while True:
                with lock:
                    k = next(taken, None)
                if k is None or errors:
                    return
                sample = submit(k)
                with lock:
                    samples.append(sample)
        except Exception as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    t0 = time.perf_counter()
    clients = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    if errors:
        raise errors[0]
    return samples, time.perf_counter() - t0
