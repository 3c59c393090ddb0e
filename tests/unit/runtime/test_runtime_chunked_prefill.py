"""Chunked prefill: a long prompt arriving never stalls the running streams for its whole length.

Test design: the model is wrapped to record every forward pass (how many tokens, how many rows). 30
streams run; a prompt of about 1,000 tokens arrives. A running stream's next token waits for the work
done between two decode steps, so that work is the inter-token gap in model tokens, independent of how
busy the machine is: with chunks of 64 it must never exceed one chunk (plus short rows joining), where
one unchunked pass would hold all 1,000. The long prompt's greedy answer must equal its answer alone.
"""

from __future__ import annotations

import threading

import pytest
from chatfleet_runtime.engine.generation import BatchGenerator
from chatfleet_runtime.engine.inflight import InflightEngine, length_groups
from chatfleet_runtime.engine.prefill import chunk_end
from chatfleet_runtime.engine.rows import GenerationRequest
from chatfleet_runtime.prompting import SamplingParams, render_prompt

CHUNK = 64
STREAMS = 30


class Recorder:
    """The model, recording (tokens, rows) of every forward pass."""

    def __init__(self, model):
        self._model = model
        self.calls: list[tuple[int, int]] = []

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        ids = kwargs["input_ids"]
        self.calls.append((int(ids.shape[1]), int(ids.shape[0])))
        return self._model(*args, **kwargs)


def ids_of(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return render_prompt(tokenizer, messages, max_context_tokens=2048, max_new_tokens=64).ids


@pytest.fixture
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared machine: one thread is several times faster
    yield
    torch.set_num_threads(threads)


def test_a_long_prompt_delays_running_streams_by_one_chunk_at_most(model, tokenizer, one_thread):
    long_ids = ids_of(tokenizer, "Tell me a long story about Kubernetes and pods. " * 40)
    assert len(long_ids) > 900
    recorder = Recorder(model)
    gen = BatchGenerator(recorder, tokenizer)
    alone = gen.generate(
        [GenerationRequest(long_ids, SamplingParams(max_new_tokens=8), use_prefix_cache=False)]
    )
    engine = InflightEngine(gen, max_rows=STREAMS + 1, prefill_chunk_tokens=CHUNK)
    results: dict[int, object] = {}
    all_done = threading.Event()
    started = threading.Event()

    def finish(i):
        def on_done(result, error):
            results[i] = error if error is not None else result
            if len(results) == STREAMS + 1:
                all_done.set()

        return on_done

    short = ids_of(tokenizer, "Hello there")
    try:
        for i in range(STREAMS):
            # long enough to outlast the prompt's chunks however late the prompt comes in: with 60 tokens the
            # streams ended before the last chunks once, on a busy machine (15 decode steps between 17 chunks)
            request = GenerationRequest(short, SamplingParams(max_new_tokens=400), use_prefix_cache=False)
            request.on_text = lambda *_: started.set()
            engine.submit(request, finish(i))
        assert started.wait(60)
        recorder.calls.clear()  # from here on: the streams run, the long prompt arrives
        engine.submit(
            GenerationRequest(long_ids, SamplingParams(max_new_tokens=8), use_prefix_cache=False),
            finish(STREAMS),
        )
        assert all_done.wait(120)
    finally:
        engine.close()
    assert all(not isinstance(r, Exception) for r in results.values()), results
    assert results[STREAMS].token_ids == alone[0].token_ids
    # The work between two decode steps of the running streams (a decode step: one token per row).
    gaps, work = [], 0
    for tokens, rows in recorder.calls:
        if tokens == 1 and rows > 1:
            gaps.append(work)
            work = 0
        else:
            work += tokens * rows
    assert sum(t * r for t, r in recorder.calls if t > 1) >= len(long_ids) - 1  # the prompt ran meanwhile
    chunks = [i for i, (tokens, _) in enumerate(recorder.calls) if tokens > 1]
    between = [c for c in recorder.calls[chunks[0] : chunks[-1]] if c[0] == 1 and c[1] > 1]
    assert len(between) >= len(chunks) - 1  # the streams decoded between the chunks
    assert max(gaps) <= CHUNK, max(gaps)


@pytest.mark.parametrize(
    ("total", "tokens", "chunks"),
    [
        (1027, 1024, [514, 513]),  # not 1,024 + a 3-token sliver
        (1000, 256, [250, 250, 250, 250]),
        (100, 256, [100]),
        (513, 256, [171, 171, 171]),
        (7, 0, [1] * 7),  # a zero chunk size still makes progress
    ],
)
def test_a_prompt_is_cut_into_the_fewest_equal_chunks_the_chunk_size_allows(total, tokens, chunks):
    done, sizes = 0, []
    while done < total:
        end = chunk_end(done, total, tokens)
        sizes.append(end - done)
        done = end
    assert sizes == chunks


def test_prompts_of_unlike_length_joining_together_prefill_apart(model, tokenizer, one_thread):
    """Ten short prompts and one of ~600 tokens (under the chunk size) arrive at once: no pass pads the
    short ones to 600 (one joint pass would compute 11 x 600 tokens for about 800 real ones)."""
    long_ids = ids_of(tokenizer, "Tell me a long story about Kubernetes and pods. " * 25)
    short = [ids_of(tokenizer, f"Hello number {i}") for i in range(10)]
    assert 500 < len(long_ids) < 1024
    recorder = Recorder(model)
    gen = BatchGenerator(recorder, tokenizer)
    engine = InflightEngine(gen, max_rows=16, prefill_chunk_tokens=1024)
    done = threading.Semaphore(0)
    errors: list = []

    def on_done(result, error):
        errors.append(error)
        done.release()

    # Queued before the engine looks (it blocks on its queue while idle): all eleven join in one pass of
    # its loop, which is the case length grouping is for.
    with engine._queue.mutex:
        for ids in [*short, long_ids]:
            request = GenerationRequest(ids, SamplingParams(max_new_tokens=2), use_prefix_cache=False)
            engine._queue.queue.append((request, on_done, gen.clock()))
        engine._queue.not_empty.notify()
    try:
        for _ in range(11):
            assert done.acquire(timeout=60)
    finally:
        engine.close()
    assert errors == [None] * 11
    real = len(long_ids) + sum(len(ids) for ids in short)
    computed = sum(tokens * rows for tokens, rows in recorder.calls if tokens > 1)
    assert computed <= 1.25 * real, (computed, real)


@pytest.mark.parametrize(
    ("lengths", "groups"),
    [
        ([30, 900, 28, 32], [[2, 0, 3], [1]]),
        ([100, 100, 100], [[0, 1, 2]]),
        ([10, 100, 1000], [[0], [1], [2]]),
        ([], []),
    ],
)
def test_length_groups_bound_the_padding_of_a_joint_prefill(lengths, groups):
    assert length_groups(lengths) == groups
    for group in groups:
        padded = max(lengths[i] for i in group) * len(group)
        assert padded - sum(lengths[i] for i in group) <= 0.25 * padded
