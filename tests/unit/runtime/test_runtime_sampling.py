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


def _nucleus_by_sort(torch, logprobs, top_p: float):
    """The reference: sort, keep the tokens whose mass before them is under top_p (always the first)."""
    values, ids = torch.sort(logprobs, dim=-1, descending=True)
    probs = values.exp()
    keep = (torch.cumsum(probs, dim=-1) - probs) < top_p
    keep[:, 0] = True
    return torch.zeros_like(keep).scatter_(1, ids, keep)


@pytest.mark.parametrize("scale", [0.05, 0.7, 3.0, 12.0], ids=["flat", "random-model", "peaked", "sharp"])
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99])
def test_histogram_nucleus_is_the_sorted_nucleus(scale, top_p):
    """The histogram nucleus (no sort of the vocabulary) keeps exactly the tokens a full sort keeps.

    Float64 logits, so both sums agree to the last token; a few tokens suppressed (-inf) in every row.
    """
    import torch
    from chatfleet_runtime.engine.sampling import nucleus

    gen = torch.Generator().manual_seed(int(scale * 100 + top_p * 10))
    logits = torch.randn((12, 50_000), generator=gen, dtype=torch.float64) * scale
    logits[:, :7] = float("-inf")
    logprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    got = nucleus(torch, logprobs, [top_p] * 12)
    want = _nucleus_by_sort(torch, logprobs, top_p)
    assert got.sum(dim=-1).tolist() == want.sum(dim=-1).tolist()
    assert torch.equal(got, want)


def test_a_flat_distributions_nucleus_is_sampled_by_its_probabilities(tokenizer):
    """Top-p over a nearly flat vocabulary (the nucleus holds thousands of tokens, past every candidate
    count, so the histogram draws it): every draw lies in the sorted nucleus, they reach both of its ends,
    and their mean token id is the nucleus's own mean (token i has probability ~ e^(-i / 10,000)) within
    four standard errors."""
    import torch

    vocab, rows, rounds = 20_000, 64, 40
    logits = -torch.arange(vocab, dtype=torch.float32)[None, :].repeat(rows, 1) * 1e-4  # token 0 best
    logprobs = torch.log_softmax(logits[:1].double(), dim=-1)
    reference = _nucleus_by_sort(torch, logprobs, 0.5)[0]
    size = int(reference.sum())
    assert size > 4096 and reference[:size].all()  # the nucleus is the first `size` tokens
    weights = logprobs[0, :size].exp()
    ids = torch.arange(size, dtype=torch.float64)
    mean = float((weights * ids).sum() / weights.sum())
    sd = float(((weights * (ids - mean) ** 2).sum() / weights.sum()).sqrt())
    drawn: list[int] = []
    for _ in range(rounds):
        batch = [
            Row(GenerationRequest([1], SamplingParams(4, 1.0, top_p=0.5)), tokenizer, 0.0)
            for _ in range(rows)
        ]
        drawn += sample(torch, logits.clone(), batch)
    assert max(drawn) < size
    assert max(drawn) > size * 0.95 and min(drawn) < size * 0.05
    assert abs(sum(drawn) / len(drawn) - mean) < 4 * sd / len(drawn) ** 0.5, (sum(drawn) / len(drawn), mean)


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
            messages,
            json.dumps(params).encode(),
            on_text=(lambda text, *_, d=deltas: d.append(text)) if streamed else None,
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
