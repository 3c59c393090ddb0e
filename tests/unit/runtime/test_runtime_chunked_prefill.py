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
from chatfleet_runtime.engine.inflight import InflightEngine
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
            request = GenerationRequest(short, SamplingParams(max_new_tokens=60), use_prefix_cache=False)
            request.on_text = lambda _text: started.set()
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
