"""Batched generation on the tiny model: batch == single, per-row limits, stops, streaming, cancel, reuse.

Test design: greedy decoding is deterministic, so every batched or cached path is checked against the
plain single-request path for identical token ids.
"""

from __future__ import annotations

import pytest
from chatfleet_runtime.engine.generation import BatchGenerator
from chatfleet_runtime.engine.prefix_cache import PrefixCache
from chatfleet_runtime.engine.rows import GenerationRequest
from chatfleet_runtime.engine.textstream import StopMatcher
from chatfleet_runtime.prompting import SamplingParams, render_prompt


@pytest.mark.parametrize(
    ("stops", "deltas", "emitted", "text", "stopped"),
    [
        pytest.param((), ["ab", "c"], ["ab", "c"], "abc", False, id="no-stops"),
        pytest.param(
            ("END",), ["hello E", "N", "D more"], ["hello ", "", ""], "hello ", True, id="split-stop"
        ),
        pytest.param(("END",), ["hello E", "x"], ["hello ", "Ex"], "hello Ex", False, id="false-alarm"),
        pytest.param(("\n", "##"), ["a#b", "\nrest"], ["a#b", ""], "a#b", True, id="two-stops"),
        pytest.param(("stop",), ["stop"], [""], "", True, id="stop-first"),
    ],
)
def test_stop_matcher(stops, deltas, emitted, text, stopped):
    m = StopMatcher(stops)
    assert [m.feed(d) for d in deltas] == emitted
    assert (m.text, m.stopped) == (text, stopped)


@pytest.fixture(scope="module")
def gen(model, tokenizer):
    return BatchGenerator(model, tokenizer, prefix_cache=PrefixCache(max_entries=4))


def prompt(tokenizer, text, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return render_prompt(tokenizer, msgs, max_context_tokens=1024, max_new_tokens=32)


def test_batch_matches_single_requests(gen, tokenizer):
    prompts = [prompt(tokenizer, t) for t in ("Hello there", "Tell me a long story about Kubernetes", "Hi")]
    params = [SamplingParams(max_new_tokens=n) for n in (12, 6, 9)]
    singles = [
        gen.generate([GenerationRequest(p.ids, sp, use_prefix_cache=False)])[0]
        for p, sp in zip(prompts, params, strict=True)
    ]
    batch = gen.generate(
        [GenerationRequest(p.ids, sp, use_prefix_cache=False) for p, sp in zip(prompts, params, strict=True)]
    )
    assert [r.token_ids for r in batch] == [r.token_ids for r in singles]
    assert [len(r.token_ids) for r in batch] == [12, 6, 9]
    assert {r.finish_reason for r in batch} == {"length"}


def test_streaming_deltas_add_up_to_text(gen, tokenizer):
    deltas: list[str] = []
    res = gen.generate(
        [
            GenerationRequest(
                prompt(tokenizer, "Hello").ids,
                SamplingParams(max_new_tokens=16),
                on_text=lambda text, *_: deltas.append(text),
            )
        ]
    )[0]
    assert "".join(deltas) == res.text and len(deltas) > 1


def test_stop_sequence_cuts_text(gen, tokenizer):
    p = prompt(tokenizer, "Hello")
    full = gen.generate([GenerationRequest(p.ids, SamplingParams(max_new_tokens=16))])[0].text
    stop = full[3:5]
    assert stop
    res = gen.generate([GenerationRequest(p.ids, SamplingParams(max_new_tokens=16, stop=(stop,)))])[0]
    assert res.finish_reason == "stop" and res.text == full[: full.find(stop)]


def test_cancellation_ends_only_that_row(model, tokenizer):
    gen = BatchGenerator(model, tokenizer, cancel_check_interval_s=0.0)
    p = prompt(tokenizer, "Hello")
    calls = {"n": 0}

    def cancelled():
        calls["n"] += 1
        return calls["n"] > 1

    a, b = gen.generate(
        [
            GenerationRequest(p.ids, SamplingParams(max_new_tokens=30), is_cancelled=cancelled),
            GenerationRequest(p.ids, SamplingParams(max_new_tokens=30)),
        ]
    )
    assert a.finish_reason == "cancelled" and len(a.token_ids) < 30
    assert b.finish_reason == "length" and len(b.token_ids) == 30


def test_seeded_sampling_is_reproducible(gen, tokenizer):
    p = prompt(tokenizer, "Hello")
    sp = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    a = gen.generate([GenerationRequest(p.ids, sp)])[0]
    b = gen.generate([GenerationRequest(p.ids, sp)])[0]
    greedy = gen.generate([GenerationRequest(p.ids, SamplingParams(max_new_tokens=10))])[0]
    assert a.token_ids == b.token_ids and a.token_ids != greedy.token_ids


def test_session_prefix_reuse_gives_identical_output(model, tokenizer):
    cache = PrefixCache(max_entries=8)
    gen = BatchGenerator(model, tokenizer, prefix_cache=cache)
    sysmsg = "You are a helpful assistant for Kubernetes questions."
    first = prompt(tokenizer, "Hello there", system=sysmsg)
    r1 = gen.generate(
        [
            GenerationRequest(
                first.ids, SamplingParams(max_new_tokens=8), session_id="c1", system_len=first.system_len
            )
        ]
    )[0]
    assert r1.cached_tokens == 0 and len(cache) == 2  # the system prefix and the conversation
    turn2 = (
        first.ids
        + r1.token_ids
        + tokenizer("<|user|>And then?<|eos|><|assistant|>", add_special_tokens=False)["input_ids"]
    )
    reused, fresh = (
        gen.generate(
            [
                GenerationRequest(
                    turn2,
                    SamplingParams(max_new_tokens=8),
                    session_id="c1",
                    system_len=first.system_len,
                    use_prefix_cache=use,
                )
            ]
        )[0]
        for use in (True, False)
    )
    assert reused.cached_tokens == len(first.ids) + len(r1.token_ids) - 1
    assert reused.token_ids == fresh.token_ids
    other = prompt(tokenizer, "Another conversation", system=sysmsg)
    r3 = gen.generate(
        [
            GenerationRequest(
                other.ids, SamplingParams(max_new_tokens=8), session_id="c2", system_len=other.system_len
            )
        ]
    )[0]
    r3_fresh = gen.generate(
        [GenerationRequest(other.ids, SamplingParams(max_new_tokens=8), use_prefix_cache=False)]
    )[0]
    assert r3.cached_tokens == other.system_len and r3.token_ids == r3_fresh.token_ids


def test_mixed_batch_with_and_without_cache_hits(model, tokenizer):
    gen = BatchGenerator(model, tokenizer, prefix_cache=PrefixCache())
    sysmsg = "Shared system prompt for everyone."
    ps = [prompt(tokenizer, f"user {i} says hi", system=sysmsg) for i in range(3)] + [
        prompt(tokenizer, "no system")
    ]
    gen.generate(
        [GenerationRequest(ps[0].ids, SamplingParams(max_new_tokens=2), system_len=ps[0].system_len)]
    )
    reqs = [GenerationRequest(p.ids, SamplingParams(max_new_tokens=6), system_len=p.system_len) for p in ps]
    batch = gen.generate(reqs)
    assert [r.cached_tokens > 0 for r in batch] == [True, True, True, False]
    fresh = [
        gen.generate([GenerationRequest(p.ids, SamplingParams(max_new_tokens=6), use_prefix_cache=False)])[0]
        for p in ps
    ]
    assert [r.token_ids for r in batch] == [r.token_ids for r in fresh]


def test_stream_chunks_are_coalesced_by_interval(model, tokenizer):
    """First text at once, then at most one chunk per interval: with a frozen clock, first + final only."""
    frozen = BatchGenerator(model, tokenizer, stream_interval_s=10.0, clock=lambda: 0.0)
    deltas: list[str] = []
    res = frozen.generate(
        [
            GenerationRequest(
                prompt(tokenizer, "Hello").ids,
                SamplingParams(max_new_tokens=20),
                on_text=lambda text, *_: deltas.append(text),
            )
        ]
    )[0]
    assert len(deltas) == 2 and "".join(deltas) == res.text


def test_non_streaming_text_equals_streaming_text(gen, tokenizer):
    p = prompt(tokenizer, "Compare")
    deltas: list[str] = []
    streamed = gen.generate(
        [
            GenerationRequest(
                p.ids, SamplingParams(max_new_tokens=24), on_text=lambda text, *_: deltas.append(text)
            )
        ]
    )[0]
    plain = gen.generate([GenerationRequest(p.ids, SamplingParams(max_new_tokens=24))])[0]
    assert plain.text == streamed.text == "".join(deltas)


def test_inflight_engine_joins_running_batch_with_identical_output(model, tokenizer):
    """Requests submitted while others run join the batch mid-flight; greedy output is unchanged."""
    import threading
    import time

    from chatfleet_runtime.engine.inflight import InflightEngine

    gen = BatchGenerator(model, tokenizer, prefix_cache=PrefixCache())
    texts = ["Hello there", "Tell me a long story about Kubernetes and pods", "Hi", "What is Triton?"]
    prompts = [prompt(tokenizer, t) for t in texts]
    lengths = [40, 12, 25, 30]
    expected = [
        gen.generate([GenerationRequest(p.ids, SamplingParams(max_new_tokens=n), use_prefix_cache=False)])[
            0
        ].token_ids
        for p, n in zip(prompts, lengths, strict=True)
    ]
    joins: list[tuple[int, int]] = []
    engine = InflightEngine(gen, max_rows=8, on_join=lambda rows, joined: joins.append((rows, joined)))
    results: dict[int, object] = {}
    done = threading.Event()

    def finish(i):
        def cb(result, error):
            results[i] = result if error is None else error
            if len(results) == len(prompts):
                done.set()

        return cb

    try:
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
            engine.submit(
                GenerationRequest(p.ids, SamplingParams(max_new_tokens=n), use_prefix_cache=False), finish(i)
            )
            time.sleep(0.01)
        assert done.wait(60)
    finally:
        engine.close()
    assert [results[i].token_ids for i in range(len(prompts))] == expected
    assert any(rows > joined for rows, joined in joins), joins  # someone joined a running batch


def test_inflight_engine_reports_errors_and_keeps_serving(model, tokenizer):
    import threading

    from chatfleet_runtime.engine.inflight import InflightEngine

    gen = BatchGenerator(model, tokenizer)
    engine = InflightEngine(gen)
    got: list = []
    event = threading.Event()

    def cb(result, error):
        got.append((result, error))
        event.set()

    try:
        engine.submit(
            GenerationRequest([], SamplingParams(max_new_tokens=3)), cb
        )  # empty prompt: prefill fails
        assert event.wait(30)
        assert got[0][0] is None and got[0][1] is not None
        event.clear()
        engine.submit(GenerationRequest(prompt(tokenizer, "ok").ids, SamplingParams(max_new_tokens=3)), cb)
        assert event.wait(30)
        assert got[1][1] is None and len(got[1][0].token_ids) == 3
    finally:
        engine.close()


def test_logit_bias_forces_a_token(gen, tokenizer):
    ids = prompt(tokenizer, "Hello there").ids
    res = gen.generate(
        [GenerationRequest(ids, SamplingParams(max_new_tokens=5, logit_bias=((100, 100.0),)))]
    )[0]
    assert res.token_ids == [100] * 5


@pytest.mark.parametrize(
    ("presence", "frequency", "generated", "winner"),
    [
        # logits: token 50 -> 3.0, token 70 -> 2.5, token 90 -> 1.0; logit -= count * f + (count > 0) * p
        pytest.param(0.0, 0.0, [50, 50, 50, 50], 50, id="no-penalty"),
        pytest.param(0.6, 0.0, [50], 70, id="presence"),  # 50: 3.0 - 0.6 = 2.4 < 2.5
        pytest.param(0.6, 0.0, [50, 70], 50, id="presence-both-seen"),  # 2.4 > 1.9
        pytest.param(0.0, 0.3, [50, 50, 50, 50], 70, id="frequency"),  # 50: 3.0 - 4 * 0.3 = 1.8 < 2.5
        pytest.param(0.0, 0.3, [50], 50, id="frequency-once"),  # 2.7 > 2.5
        pytest.param(-2.1, 0.0, [90], 90, id="negative-presence-favours"),  # 90: 1.0 + 2.1 = 3.1 > 3.0
    ],
)
def test_penalties_follow_openai_arithmetic(gen, presence, frequency, generated, winner):
    import torch
    from chatfleet_runtime.engine.rows import Row
    from chatfleet_runtime.engine.sampling import sample

    logits = torch.full((1, gen.vocab_size), -10.0)
    logits[0, 50], logits[0, 70], logits[0, 90] = 3.0, 2.5, 1.0
    params = SamplingParams(4, presence_penalty=presence, frequency_penalty=frequency)
    row = Row(GenerationRequest([1], params), gen.tokenizer, 0.0)
    row.generated = list(generated)
    assert sample(torch, logits, [row], gen.suppress) == [winner]


def test_public_steps_merge_a_late_row_with_output_identical_to_generate(model, tokenizer):
    """new_row -> start -> step -> merge (a row joins one step late) -> step until done == generate."""
    import torch

    engine = BatchGenerator(model, tokenizer)
    reqs = [
        GenerationRequest(prompt(tokenizer, text).ids, SamplingParams(max_new_tokens=n))
        for text, n in (("Hello there", 6), ("Tell me a story about a dragon", 4))
    ]
    expected = [r.token_ids for r in engine.generate(reqs)]
    with torch.inference_mode():
        first = engine.start([engine.new_row(reqs[0], 0.0)])
        batch, finished = engine.step(first)
        assert not finished and len(batch.rows) == 1
        batch = engine.merge(batch, engine.start([engine.new_row(reqs[1], 0.0)]))
        done = []
        while batch is not None:
            batch, finished = engine.step(batch)
            done += finished
    results = {id(row.req): engine.result(row) for row in done}
    assert [results[id(r)].token_ids for r in reqs] == expected


def test_batch_width_follows_live_rows_under_steady_traffic(model, tokenizer):
    """Rows join and leave for 200 steps and the batch never empties: the KV width stays at the longest
    live row's span (never the batch's age), and every row's greedy tokens equal its tokens alone."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared machine: one thread is several times faster
    try:
        _steady_traffic(BatchGenerator(model, tokenizer), tokenizer)
    finally:
        torch.set_num_threads(threads)


def _steady_traffic(engine, tokenizer):
    import torch

    texts = ["Hello there", "Tell me a story about a dragon", "Hi", "What is Triton?"]
    kinds = [(t, n) for t in texts for n in range(4, 11)]
    alone = {
        kind: engine.generate([GenerationRequest(prompt(tokenizer, kind[0]).ids, SamplingParams(kind[1]))])[0]
        for kind in kinds
    }
    reqs = [GenerationRequest(prompt(tokenizer, t).ids, SamplingParams(n)) for t, n in kinds * 20]
    expected = {id(r): alone[kind].token_ids for r, kind in zip(reqs, kinds * 20, strict=True)}
    longest = max(len(r.prompt_ids) + r.params.max_new_tokens for r in reqs)
    waiting, done, widths = list(reqs), [], []
    with torch.inference_mode():
        batch = engine.start([engine.new_row(waiting.pop(0), 0.0)])
        for _ in range(200):
            while waiting and len(batch.rows) < 6:  # rows join as soon as there is room
                batch = engine.merge(batch, engine.start([engine.new_row(waiting.pop(0), 0.0)]))
            batch, finished = engine.step(batch)
            done += finished
            if batch is None:
                break
            widths.append(batch.mask.shape[1])
            assert all(layer.keys.shape[2] == batch.mask.shape[1] for layer in batch.cache.layers)
    assert len(done) >= 40 and len(widths) == 200, (len(done), len(widths))
    assert max(widths) <= longest, (max(widths), longest)  # a growing cache would reach ~200
    assert all(engine.result(row).token_ids == expected[id(row.req)] for row in done)


def test_a_decode_step_writes_its_column_in_place(model, tokenizer):
    """Steps with no row joining or leaving copy nothing: each layer's keys stay views of the same buffer,
    widening by one column (``torch.cat`` copied the whole cache every step, every layer). The buffer
    never holds more columns than prompt + max tokens, what the KV budget counts, and the tokens are
    those of the batch before (checked in the tests above against each row alone)."""
    import torch
    from chatfleet_runtime.engine.kvcache import storage_bytes

    engine = BatchGenerator(model, tokenizer)
    reqs = [
        GenerationRequest(
            prompt(tokenizer, text).ids, SamplingParams(max_new_tokens=12), use_prefix_cache=False
        )
        for text in ("Hello there", "Tell me a story about a dragon")
    ]
    widest = max(len(r.prompt_ids) for r in reqs) + 12
    per_row = engine.kv_bytes_per_position() * widest
    with torch.inference_mode():
        batch, _ = engine.step(engine.start([engine.new_row(r, 0.0) for r in reqs]))
        seen = []
        while batch is not None and len(batch.rows) == 2:
            seen.append(
                (
                    batch.mask.shape[1],
                    [layer.keys.untyped_storage().data_ptr() for layer in batch.cache.layers],
                )
            )
            assert all(layer.keys.shape[2] == batch.mask.shape[1] for layer in batch.cache.layers)
            assert storage_bytes(batch.cache) <= 2 * per_row
            batch, _ = engine.step(batch)
    assert len(seen) >= 8, seen
    widths = [w for w, _ in seen]
    assert widths == list(range(widths[0], widths[0] + len(widths)))
    assert all(ptrs == seen[0][1] for _, ptrs in seen), "a step copied the cache"


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_an_answer_ending_inside_a_character_keeps_its_text(gen, tokenizer, streamed):
    """Token 100 is one byte of a multi-byte character: the detokenizer holds such text back until the
    character completes; when generation ends first, the held-back text is still the answer's end."""
    assert tokenizer.decode([100]).endswith("\ufffd")
    deltas: list[str] = []
    params = SamplingParams(max_new_tokens=3, logit_bias=((100, 100.0),))
    on_text = (lambda text, *_: deltas.append(text)) if streamed else None
    res = gen.generate([GenerationRequest(prompt(tokenizer, "Hi").ids, params, on_text=on_text)])[0]
    assert res.token_ids == [100] * 3
    assert res.text == tokenizer.decode(res.token_ids, skip_special_tokens=True) != ""
    assert not streamed or "".join(deltas) == res.text
