"""Batched sampling: the whole batch's temperature, top-k, top-p and seeds as tensor operations.

Test design: the distribution tests sample one known distribution in 4,000 rows of one batch and compare
the frequencies with the arithmetic of top-k and top-p (a wrong cut or a shared draw moves them far
outside the tolerance). The seed test runs one seeded chat alone and in a full batch of other sampled
chats, streamed and not, through ``ChatService.prepare`` / ``submit`` (the Triton model's path): the
text must be the same every time, which fails whenever a seeded row's draws depend on its batch.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter

import pytest
from chatfleet_runtime.engine.rows import GenerationRequest, Row
from chatfleet_runtime.engine.sampling import sample
from chatfleet_runtime.prompting import SamplingParams

ROWS = 4000
#: Token probabilities of the test distribution: tokens 3, 5, 7, 9 hold 0.4, 0.3, 0.2, 0.1; the other
#: 1,020 tokens of the vocabulary next to nothing (so the nucleus lies among the best 256 candidates).
DIST = {3: 0.4, 5: 0.3, 7: 0.2, 9: 0.1}
VOCAB = 1024


def _frequencies(tokenizer, **params) -> dict[int, float]:
    import torch

    logits = torch.full((ROWS, VOCAB), -30.0)
    for token, p in DIST.items():
        logits[:, token] = math.log(p)
    rows = [Row(GenerationRequest([1], SamplingParams(4, **params)), tokenizer, 0.0) for _ in range(ROWS)]
    counts = Counter(sample(torch, logits, rows))
    return {token: n / ROWS for token, n in counts.items()}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({"temperature": 1.0}, DIST, id="temperature-1"),
        # mass before each: 0, 0.4, 0.7 -> top_p 0.65 keeps 3 and 5: 0.4 / 0.7, 0.3 / 0.7
        pytest.param({"temperature": 1.0, "top_p": 0.65}, {3: 4 / 7, 5: 3 / 7}, id="top-p"),
        pytest.param({"temperature": 1.0, "top_k": 3}, {3: 4 / 9, 5: 3 / 9, 7: 2 / 9}, id="top-k"),
        pytest.param({"temperature": 1.0, "top_k": 1}, {3: 1.0}, id="top-k-1"),
        pytest.param({"temperature": 1.0, "top_k": 3, "top_p": 0.5}, {3: 4 / 7, 5: 3 / 7}, id="both"),
        # temperature 0.5 squares the odds: 0.16, 0.09, 0.04, 0.01 over 0.30
        pytest.param({"temperature": 0.5}, {3: 16 / 30, 5: 9 / 30, 7: 4 / 30, 9: 1 / 30}, id="temperature"),
        pytest.param({"temperature": 0.0}, {3: 1.0}, id="greedy"),
    ],
)
def test_batched_sampling_follows_the_distribution(tokenizer, params, expected):
    got = _frequencies(tokenizer, **params)
    assert set(got) <= set(expected), got
    for token, p in expected.items():
        assert abs(got.get(token, 0.0) - p) < 0.04, (token, got)


def test_rows_of_one_batch_keep_their_own_settings(tokenizer):
    """Greedy, top-k 1 and sampled rows side by side: each row follows its own settings."""
    import torch

    logits = torch.full((3 * ROWS, VOCAB), -30.0)
    for token, p in DIST.items():
        logits[:, token] = math.log(p)
    settings = [{"temperature": 0.0}, {"temperature": 1.5, "top_k": 1}, {"temperature": 1.0, "top_p": 0.65}]
    rows = [
        Row(GenerationRequest([1], SamplingParams(4, **settings[i % 3])), tokenizer, 0.0)
        for i in range(3 * ROWS)
    ]
    out = sample(torch, logits, rows)
    assert set(out[0::3]) == {3} and set(out[1::3]) == {3}
    assert set(out[2::3]) == {3, 5}


def test_rows_with_the_same_seed_draw_the_same_tokens(tokenizer):
    import torch

    logits = torch.zeros((64, VOCAB))  # flat: the whole vocabulary is the nucleus
    rows = [
        Row(GenerationRequest([1], SamplingParams(4, 1.0, seed=i % 2)), tokenizer, 0.0) for i in range(64)
    ]
    for row in rows:
        row.rng = torch.Generator().manual_seed(row.req.params.seed)
    out = sample(torch, logits, rows)
    assert len(set(out[0::2])) == 1 and len(set(out[1::2])) == 1 and out[0] != out[1]


@pytest.fixture
def seed_service(tiny_model_dir, model, tokenizer):
    from chatfleet_runtime.engine.service import ChatService, ServiceSettings

    settings = ServiceSettings(
        model_dir=str(tiny_model_dir),
        tokenizer_dir=str(tiny_model_dir),
        max_context_tokens=512,
        max_new_tokens=32,
        max_batch_size=16,
        warmup=False,
    )
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared machine: one thread is several times faster
    service = ChatService(settings, model=model, tokenizer=tokenizer)
    service.start_inflight()
    try:
        yield service
    finally:
        service.close()
        torch.set_num_threads(threads)


def _chats(service, chats: list[tuple[str, dict, bool]]) -> list[str]:
    """Submit every chat at once; the texts in order (streamed ones: their deltas joined)."""
    texts: dict[int, str] = {}
    errors: list = []
    all_done = threading.Event()
    for i, (content, params, streamed) in enumerate(chats):
        deltas: list[str] = []
        messages = json.dumps([{"role": "user", "content": content}]).encode()
        prep = service.prepare(
            messages, json.dumps(params).encode(), on_text=deltas.append if streamed else None
        )
        assert prep.request is not None, prep.error

        def on_done(result, error, i=i, deltas=deltas, streamed=streamed):  # on the engine's thread
            if error is not None:
                errors.append(error)
            else:
                texts[i] = "".join(deltas) if streamed else result.text
            if len(texts) + len(errors) == len(chats):
                all_done.set()

        service.submit(prep.request, on_done)
    assert all_done.wait(120)
    assert not errors, errors
    return [texts[i] for i in range(len(chats))]


def test_a_seed_gives_the_same_text_streamed_or_not_alone_or_in_a_full_batch(seed_service):
    seeded = (
        "Tell me a story about a dragon",
        {"max_tokens": 24, "temperature": 0.9, "top_p": 0.9, "seed": 7},
    )
    others = [
        (
            f"Hello number {i}",
            {"max_tokens": 8 + i, "temperature": 1.0, "top_p": 0.8 + i / 100, "top_k": i},
            i % 2,
        )
        for i in range(15)
    ]
    alone = _chats(seed_service, [(*seeded, False)])[0]
    alone_streamed = _chats(seed_service, [(*seeded, True)])[0]
    batch = _chats(seed_service, [*others[:7], (*seeded, False), *others[7:]])[7]
    batch_streamed = _chats(seed_service, [*others[:3], (*seeded, True), *others[3:]])[3]
    other_seed = _chats(seed_service, [(seeded[0], {**seeded[1], "seed": 8}, False)])[0]
    assert alone and alone == alone_streamed == batch == batch_streamed
    assert other_seed != alone  # the seed matters
