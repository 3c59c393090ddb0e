"""One request's failure never fails the others in its batch (property test, seeded random loop).

Test design: each round builds a batch that mixes good greedy requests with randomly chosen bad ones
(a seed torch refuses, NaN or negative temperature, out-of-vocabulary token ids, an empty prompt, a
streaming hook that raises, a cancellation hook that raises, ...) in random order. Whatever the bad rows
carry, every good row must produce exactly the tokens it produces alone; a bad row ends with an error
result (or a normal one) but never raises out of the batch. The same mixes go through the in-flight
engine (every row is answered exactly once, good rows identical) and through ChatService with raw JSON
parameters (the Triton wire format), where bad ones must be `invalid_request:` errors naming the field.
"""

from __future__ import annotations

import json
import math
import random
import threading

import pytest
from chatfleet_runtime.engine.generation import BatchGenerator
from chatfleet_runtime.engine.inflight import InflightEngine
from chatfleet_runtime.engine.rows import GenerationRequest
from chatfleet_runtime.prompting import SamplingParams, render_prompt

ROUNDS = 12


def prompt_ids(tokenizer, text):
    return render_prompt(
        tokenizer, [{"role": "user", "content": text}], max_context_tokens=512, max_new_tokens=16
    ).ids


def _raise(*_a):
    raise RuntimeError("hook exploded")


def bad_request(rng: random.Random, ids: list[int], vocab: int) -> GenerationRequest:
    """A request with one random defect (a client's or a hook's)."""
    kind = rng.choice(
        [
            "huge-seed",
            "negative-huge-seed",
            "nan-temperature",
            "negative-temperature",
            "inf-temperature",
            "nan-top-p",
            "oov-ids",
            "negative-ids",
            "empty-prompt",
            "on-text-raises",
            "is-cancelled-raises",
            "zero-max-tokens",
        ]
    )
    sp = SamplingParams(max_new_tokens=rng.randint(1, 8))
    if kind == "huge-seed":
        return GenerationRequest(ids, SamplingParams(4, 1.0, 1.0, (), 2**64 + rng.randint(0, 10**6)))
    if kind == "negative-huge-seed":
        return GenerationRequest(ids, SamplingParams(4, 1.0, 1.0, (), -(2**64)))
    if kind == "nan-temperature":
        return GenerationRequest(ids, SamplingParams(4, math.nan, 1.0))
    if kind == "negative-temperature":
        return GenerationRequest(ids, SamplingParams(4, -1.0, 1.0, (), 3))
    if kind == "inf-temperature":
        return GenerationRequest(ids, SamplingParams(4, math.inf, 0.5, (), 3))
    if kind == "nan-top-p":
        return GenerationRequest(ids, SamplingParams(4, 1.0, math.nan, (), 3))
    if kind == "oov-ids":
        return GenerationRequest([*ids[:-1], vocab + 1000], sp)
    if kind == "negative-ids":
        return GenerationRequest([-5, *ids], sp)
    if kind == "empty-prompt":
        return GenerationRequest([], sp)
    if kind == "on-text-raises":
        return GenerationRequest(ids, sp, on_text=_raise)
    if kind == "is-cancelled-raises":
        return GenerationRequest(ids, sp, is_cancelled=_raise)
    return GenerationRequest(ids, SamplingParams(0))


@pytest.fixture(scope="module")
def setup(model, tokenizer):
    gen = BatchGenerator(model, tokenizer)
    texts = ["Hello there", "Tell me about Kubernetes", "Hi", "What is a canary?"]
    ids = [prompt_ids(tokenizer, t) for t in texts]
    alone = {
        (i, n): gen.generate([GenerationRequest(ids[i], SamplingParams(max_new_tokens=n))])[0].token_ids
        for i in range(len(ids))
        for n in (3, 6)
    }
    return gen, ids, alone, model.get_output_embeddings().weight.shape[0]


def mixed_batch(rng, ids, vocab):
    """[(request, expected token ids or None for a bad row)] in random order, at least one good row."""
    rows = []
    for _ in range(rng.randint(1, 3)):
        i, n = rng.randrange(len(ids)), rng.choice((3, 6))
        rows.append((GenerationRequest(ids[i], SamplingParams(max_new_tokens=n)), (i, n)))
    for _ in range(rng.randint(1, 3)):
        rows.append((bad_request(rng, ids[rng.randrange(len(ids))], vocab), None))
    rng.shuffle(rows)
    return rows


def test_bad_rows_never_fail_the_good_rows_of_a_batch(setup):
    gen, ids, alone, vocab = setup
    rng = random.Random(20261123)
    for round_ in range(ROUNDS):
        rows = mixed_batch(rng, ids, vocab)
        results = gen.generate([r for r, _ in rows])  # must not raise, whatever the bad rows carry
        assert len(results) == len(rows)
        for (_, key), res in zip(rows, results, strict=True):
            if key is not None:
                assert res.error is None, (round_, res.error)
                assert res.token_ids == alone[key], round_
            elif res.error is not None:
                assert res.finish_reason == "error" and res.token_ids == []


def collect(engine, requests) -> dict[int, list]:
    """Submit every request to the engine; wait until each has been answered; {index: [answers]}."""
    answers: dict[int, list] = {}
    done = threading.Event()
    lock = threading.Lock()

    def on_done(k, result, error):
        with lock:
            answers.setdefault(k, []).append((result, error))
            if len(answers) == len(requests):
                done.set()

    for k, req in enumerate(requests):
        engine.submit(req, lambda r, e, k=k: on_done(k, r, e))
    assert done.wait(60), answers
    return answers


def test_bad_rows_never_fail_the_good_rows_in_flight(setup):
    gen, ids, alone, vocab = setup
    rng = random.Random(7)
    engine = InflightEngine(gen, max_rows=8)
    try:
        for round_ in range(ROUNDS // 2):
            rows = mixed_batch(rng, ids, vocab)
            answers = collect(engine, [req for req, _ in rows])
            for k, (_, key) in enumerate(rows):
                assert len(answers[k]) == 1  # answered exactly once
                result, error = answers[k][0]
                if key is not None:
                    assert error is None, (round_, error)
                    assert result.token_ids == alone[key]
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"seed": 2**64}, "seed: 18446744073709551616 is outside", id="seed-2^64"),
        pytest.param({"seed": 2**63}, "seed: 9223372036854775808 is outside", id="seed-2^63"),
        pytest.param({"seed": -(2**63) - 1}, "seed: -9223372036854775809 is outside", id="seed-neg"),
        pytest.param({"seed": 1.5}, "seed: must be an integer", id="seed-float"),
        pytest.param({"temperature": "NaN"}, "temperature: must be a number", id="temperature-str"),
        pytest.param({"top_p": 2}, "top_p: 2 is outside", id="top-p"),
        pytest.param({"max_tokens": -1}, "max_tokens: -1 is outside", id="max-tokens"),
        pytest.param({"frequency_penalty": 3}, "frequency_penalty: 3 is outside", id="frequency"),
        pytest.param({"presence_penalty": -2.5}, "presence_penalty: -2.5 is outside", id="presence"),
        pytest.param({"stream": "no"}, "stream: must be true or false", id="stream"),
    ],
)
def test_service_refuses_out_of_range_numbers_naming_the_field(service, params, message):
    prep = service.prepare(b'[{"role":"user","content":"hi"}]', json.dumps(params).encode())
    assert prep.request is None
    assert prep.error.startswith("invalid_request: " + message), prep.error


def test_service_raw_json_mixes_never_fail_good_rows(service, setup):
    _, _, alone, _ = setup
    rng = random.Random(99)
    bad_params = [
        {"seed": 2**64},
        {"seed": -(2**70)},
        {"temperature": 1e308 * 10},  # inf
        {"temperature": -3},
        {"top_p": 0},
        {"max_tokens": 10**12},
        {"presence_penalty": 1e9},
        {"seed": "x"},
        {"stop": [1, 2]},
    ]
    for round_ in range(ROUNDS // 2):
        good = [(rng.choice(("Hello there", "Hi")), rng.choice((3, 6))) for _ in range(rng.randint(1, 3))]
        bad = [rng.choice(bad_params) for _ in range(rng.randint(1, 3))]
        raw = [(json.dumps([{"role": "user", "content": t}]), {"max_tokens": n}, (t, n)) for t, n in good] + [
            (json.dumps([{"role": "user", "content": "Hi"}]), p, None) for p in bad
        ]
        rng.shuffle(raw)
        prepared = [service.prepare(m.encode(), json.dumps(p).encode()) for m, p, _ in raw]
        results = iter(service.run([p.request for p in prepared if p.request is not None]))
        for (_, _, key), prep in zip(raw, prepared, strict=True):
            if key is None:
                assert prep.request is None and prep.error.startswith("invalid_request: "), round_
                continue
            result = next(results)
            assert result.error is None
            text, n = key
            assert result.token_ids == alone[(0 if text == "Hello there" else 2, n)]


@pytest.fixture(scope="module")
def service(tiny_model_dir, model, tokenizer):
    from chatfleet_runtime.engine.service import ChatService, ServiceSettings

    settings = ServiceSettings(
        model_dir=str(tiny_model_dir),
        tokenizer_dir=str(tiny_model_dir),
        max_context_tokens=512,
        max_new_tokens=16,
        warmup=False,
    )
    return ChatService(settings, model=model, tokenizer=tokenizer)


def test_service_drops_the_stream_hook_when_stream_is_false(service):
    """`stream: false` (a non-streaming request on the decoupled model) runs without deltas."""
    hook = [].append
    streamed = service.prepare(b"hi", b'{"max_tokens": 2}', on_text=hook)
    quiet = service.prepare(b"hi", b'{"max_tokens": 2, "stream": false}', on_text=hook)
    assert streamed.request.on_text is hook and quiet.request is not None and quiet.request.on_text is None
