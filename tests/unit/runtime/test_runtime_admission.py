"""Admission by KV budget: the pure planner (table) and the in-flight engine applying it.

Test design: the table walks the planner through fit, first-come-first-served blocking, the queue
bound, the wait limit and a request too big to ever fit. The engine test sets a budget of two rows'
worth of KV and submits six long requests at once: two run at a time and the rest wait their turn
(none refused while the queue has room); with a queue of one and no waiting time, the surplus is
refused at once with an `overloaded` error that the chat API turns into 429.

The budget resolved from memory (kvsizing): a table of the pure sizing (fraction of the device after
loading, instances sharing it, an absolute memory, the prefix store's share, the row limit) and of the
starts it refuses; then the engine under a resolved budget of 3 rows with 5 requests, one of them a
conversation's next turn with a cached prefix, measuring the sum of the cache tensors' bytes after every
prefill, merge and step (never over the budget); a joint prefill with cached prefixes no wider than its
longest prompt; a merge that frees the caches it joins; and ChatService starting its engine from the
sizing and refusing past it. The engine's first admission is gated until every request has arrived, so
the counts do not depend on thread timing.
"""

from __future__ import annotations

import threading

import pytest
from chatfleet_runtime.engine.admission import (
    Plan,
    batch_kv_bytes,
    fits,
    kv_bytes_per_position,
    plan_admission,
)
from chatfleet_runtime.engine.rows import GenerationRequest
from chatfleet_runtime.prompting import SamplingParams, render_prompt


def test_kv_arithmetic():
    assert kv_bytes_per_position(24, 2, 64, 2) == 12288
    assert batch_kv_bytes([100, 300, 200], 10) == 9000
    assert fits([300, 300], 300, 10, 9000) and not fits([300, 300], 301, 10, 9000)
    assert fits([10**6], 10**6, 10, 0)  # no budget


BASE = {"per_position": 10, "budget": 6000, "room": 8, "max_waiting": 4, "max_wait_s": 10.0, "now": 5.0}


@pytest.mark.parametrize(
    ("live", "waiting", "changes", "plan"),
    [
        pytest.param([], [(300, 0.0), (300, 0.0)], {}, Plan((0, 1), ()), id="both-fit"),  # 2 x 300 x 10
        pytest.param([300], [(300, 0.0), (300, 0.0)], {}, Plan((0,), ()), id="second-waits"),
        # 100 would fit (2 x 200 x 10), but 400 came first (2 x 400 x 10 = 8000) and blocks it
        pytest.param([200], [(400, 4.0), (100, 4.0)], {}, Plan((), ()), id="first-come-first-served"),
        pytest.param([300, 300], [(100, 4.0)] * 6, {}, Plan((), (4, 5)), id="queue-bound"),
        pytest.param([300, 300], [(100, -5.0), (100, 4.0)], {}, Plan((), (0,)), id="waited-too-long"),
        pytest.param([], [(700, 5.0), (100, 5.0)], {}, Plan((1,), (0,)), id="too-big-alone"),
        pytest.param([100], [(100, 5.0)], {"room": 1}, Plan((), ()), id="no-room"),
        pytest.param([300] * 7, [(900, 5.0)], {"budget": 0}, Plan((0,), ()), id="no-budget"),
    ],
)
def test_plan_admission(live, waiting, changes, plan):
    assert plan_admission(live, waiting, **{**BASE, **changes}) == plan


def _gate(generator) -> threading.Event:
    """Hold the engine's thread at its first admission (its clock) until the returned event is set, so
    every request of a test has arrived before the engine decides: no race with fast tiny-model rows."""
    opened = threading.Event()
    clock = generator.clock

    def gated():
        if threading.current_thread().name == "chatfleet-inflight":
            assert opened.wait(60), "the test never opened the gate"
        return clock()

    generator.clock = gated
    return opened


def _submit_all(engine, requests, gate: threading.Event | None = None):
    results: list = [None] * len(requests)
    done = threading.Event()
    count = [0]

    def finish(i):
        def on_done(result, error):  # on the engine's thread
            results[i] = (result, error)
            count[0] += 1
            if count[0] == len(requests):
                done.set()

        return on_done

    for i, r in enumerate(requests):
        engine.submit(r, finish(i))
    if gate is not None:
        gate.set()
    assert done.wait(120)
    return results


@pytest.mark.parametrize("queue", [8, 1])
def test_engine_holds_the_kv_budget_and_refuses_past_the_queue(model, tokenizer, queue):
    import torch
    from chatfleet_runtime.engine.generation import BatchGenerator
    from chatfleet_runtime.engine.inflight import InflightEngine

    ids = render_prompt(
        tokenizer, [{"role": "user", "content": "Hello there"}], max_context_tokens=512, max_new_tokens=24
    ).ids
    requests = [
        GenerationRequest(ids, SamplingParams(max_new_tokens=24), use_prefix_cache=False) for _ in range(6)
    ]
    gen = BatchGenerator(model, tokenizer)
    budget = batch_kv_bytes([len(ids) + 24] * 2, gen.kv_bytes_per_position())  # two rows' worth
    joins: list[int] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = InflightEngine(
        gen,
        max_rows=8,
        on_join=lambda rows, joined: joins.append(rows),
        kv_budget_bytes=budget,
        max_waiting=queue,
        max_wait_s=60.0 if queue > 1 else 0.0,
    )
    try:
        results = _submit_all(engine, requests)
    finally:
        engine.close()
        torch.set_num_threads(threads)
    assert max(joins) <= 2, joins  # never more rows than the budget holds
    refused = [e for _, e in results if e is not None]
    if queue > 1:
        assert not refused and all(len(r.token_ids) == 24 for r, _ in results)
    else:
        assert refused and all(getattr(e, "kind", "") == "overloaded" for e in refused)
        assert all("kv budget" in str(e) for e in refused)
        assert len(refused) < len(requests)  # the first ones ran


# ---- the budget resolved from memory (kvsizing), and held by the engine ---------------------------------

GiB, MiB = 2**30, 2**20
SIZE = {
    "device_memory": 80 * GiB, "loaded_bytes": GiB, "instances": 1, "fraction": 0.9, "memory_bytes": 0,
    "prefix_bytes": 0, "per_position": 12288, "typical_prompt": 512, "max_new_tokens": 256, "max_rows": 256,
}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "memory", "budget", "prefix", "rows"),
    [
        # 0.9 x (80 - 1) GiB; a tenth for the prefix store; rows of 768 x 12 KiB = 9 MiB: 7,280 fit, 256 run
        pytest.param(
            {},
            int(0.9 * 79 * GiB),
            int(0.9 * 79 * GiB) - int(0.9 * 79 * GiB * 0.1),
            None,
            256,
            id="gpu-fraction-default",
        ),
        # two instances share the GPU: each holds its weights and gets half of what is left
        pytest.param({"instances": 2}, int(0.9 * 78 * GiB) // 2, None, None, 256, id="two-instances"),
        # an absolute memory wins over the fraction (and the device is not asked)
        pytest.param(
            {"memory_bytes": 100 * MiB, "device_memory": 0},
            100 * MiB,
            90 * MiB,
            10 * MiB,
            10,
            id="absolute-memory",
        ),
        pytest.param(
            {"memory_bytes": 100 * MiB, "prefix_bytes": 64 * MiB},
            100 * MiB,
            36 * MiB,
            64 * MiB,
            4,
            id="prefix-store-given",
        ),
        # rows follow the budget when it fits fewer than max_batch_size
        pytest.param(
            {"memory_bytes": 10 * GiB, "max_rows": 4096},
            10 * GiB,
            9 * GiB,
            GiB,
            1024,
            id="rows-from-the-budget",
        ),
        pytest.param({"fraction": 0.0}, 0, 0, 256 * MiB, 256, id="no-budget"),
    ],
)
def test_kv_sizing(changes, memory, budget, prefix, rows):
    from chatfleet_runtime.engine.kvsizing import kv_sizing

    sizing = kv_sizing(**{**SIZE, **changes})
    assert sizing.memory == memory and sizing.rows == rows
    assert sizing.budget + (sizing.prefix_cache if sizing.memory else 0) == sizing.memory
    assert budget is None or sizing.budget == budget
    assert prefix is None or sizing.prefix_cache == prefix
    assert "rows" in sizing.describe()


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        pytest.param({"loaded_bytes": 80 * GiB}, "kv_memory_fraction", id="weights-fill-the-device"),
        pytest.param(
            {"memory_bytes": 100 * MiB, "prefix_bytes": 100 * MiB},
            "prefix_cache_bytes",
            id="prefix-store-takes-it-all",
        ),
        pytest.param({"memory_bytes": 5 * MiB}, "kv_typical_prompt_tokens", id="not-one-row"),
    ],
)
def test_kv_sizing_refuses_what_cannot_work(changes, names):
    from chatfleet_runtime.engine.kvsizing import KvSizingError, kv_sizing

    with pytest.raises(KvSizingError, match=names):
        kv_sizing(**{**SIZE, **changes})


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        pytest.param({"memory.max": "8589934592\n"}, 8 * GiB, id="cgroup-v2"),
        pytest.param({"memory.max": "max\n"}, 64 * GiB, id="cgroup-v2-no-limit"),
        pytest.param({"memory/memory.limit_in_bytes": "4294967296\n"}, 4 * GiB, id="cgroup-v1"),
        pytest.param({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 64 * GiB, id="v1-unlimited"),
        pytest.param({}, 64 * GiB, id="no-cgroup"),
    ],
)
def test_container_memory_limit(tmp_path, files, limit):
    from chatfleet_runtime.engine.kvsizing import container_memory_limit

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "meminfo").write_text(f"MemTotal:       {64 * GiB // 1024} kB\nMemFree: 1 kB\n")
    assert container_memory_limit(tmp_path, tmp_path / "meminfo") == limit


def test_resident_bytes_is_what_a_cpu_instance_holds(tmp_path):
    import os

    from chatfleet_runtime.engine.kvsizing import resident_bytes

    (tmp_path / "statm").write_text("5000 1200 300 10 0 900 0\n")  # size resident shared text lib data dt
    assert resident_bytes(tmp_path / "statm") == 1200 * os.sysconf("SC_PAGE_SIZE")
    assert resident_bytes() > 0 and resident_bytes(tmp_path / "missing") == 0


def _ids(tokenizer, text: str, new: int = 8) -> list[int]:
    return render_prompt(
        tokenizer, [{"role": "user", "content": text}], max_context_tokens=512, max_new_tokens=new
    ).ids


def _cache_bytes(batch) -> int:
    """The running batch's KV cache: the bytes every layer's key and value tensors hold, spare columns
    included (the cache's views widen into buffers with room to grow, ``kvcache``)."""
    from chatfleet_runtime.engine.kvcache import storage_bytes

    return storage_bytes(batch.cache)


def test_a_joint_prefill_with_cached_prefixes_is_no_wider_than_its_longest_prompt(model, tokenizer):
    """Rows prefilled together with cached prefixes of other lengths used to be padded inside
    ([cached | pad | new]), so the batch was pmax + nmax wide, wider than any row's prompt and outside
    what the KV budget counts (rows x longest prompt + max tokens). Now every row is right-aligned."""
    from chatfleet_runtime.engine.generation import BatchGenerator
    from chatfleet_runtime.engine.prefix_cache import PrefixCache

    gen = BatchGenerator(model, tokenizer, prefix_cache=PrefixCache(8, 2**30))
    first = _ids(tokenizer, "Tell me a long story about a lighthouse keeper and the sea " * 3)
    said = gen.generate([GenerationRequest(first, SamplingParams(max_new_tokens=4), session_id="a")])[0]
    turn2 = first + said.token_ids + _ids(tokenizer, "and then?")[-3:]
    other = _ids(tokenizer, "A different question about birds and their songs " * 2)
    requests = [
        GenerationRequest(turn2, SamplingParams(max_new_tokens=6), session_id="a"),
        GenerationRequest(other, SamplingParams(max_new_tokens=6), use_prefix_cache=False),
    ]
    rows = [gen.new_row(r, 0.0) for r in requests]
    batch = gen.start(rows)
    assert rows[0].cached > len(other) // 2 and rows[1].cached == 0  # a long hit beside a long miss
    width = max(len(turn2), len(other))
    assert batch.mask.shape[1] == width, (batch.mask.shape, len(turn2), len(other), rows[0].cached)
    assert all(layer.keys.shape[2] == width for layer in batch.cache.layers)
    assert _cache_bytes(batch) == 2 * width * gen.kv_bytes_per_position()
    while batch is not None:  # and the answers are those each row gets alone
        batch, _ = gen.step(batch)
    alone = [gen.generate([r])[0].token_ids for r in requests]
    assert [gen.result(r).token_ids for r in rows] == alone


def test_a_merge_releases_the_old_caches_layer_by_layer(model, tokenizer):
    """Merging makes a new cache; the two it came from are dropped layer by layer as it goes, so the
    device holds the merged cache plus one layer at most, never the old and the new caches together."""
    from chatfleet_runtime.engine.generation import BatchGenerator

    gen = BatchGenerator(model, tokenizer)
    a = gen.start(
        [gen.new_row(GenerationRequest(_ids(tokenizer, "one"), SamplingParams(max_new_tokens=4)), 0.0)]
    )
    b = gen.start(
        [gen.new_row(GenerationRequest(_ids(tokenizer, "two two"), SamplingParams(max_new_tokens=4)), 0.0)]
    )
    merged = gen.merge(a, b)
    assert all(layer.keys is None and layer.values is None for layer in (*a.cache.layers, *b.cache.layers))
    assert all(layer.keys.shape[0] == 2 for layer in merged.cache.layers)


@pytest.mark.parametrize("queue", [0, 4])
def test_the_resolved_budget_holds_the_engine_kv_memory(model, tokenizer, queue):
    """A budget (kv_sizing from a KV memory) that fits 3 rows; 3 + 2 requests of mixed lengths, one of
    them a conversation's next turn with a cached prefix. With room to wait all 5 complete, 3 at a time;
    without, 2 are refused `overloaded` (the chat API's 429). The cache's bytes never exceed the budget."""
    import torch
    from chatfleet_runtime.engine.generation import BatchGenerator
    from chatfleet_runtime.engine.inflight import InflightEngine
    from chatfleet_runtime.engine.kvsizing import kv_sizing
    from chatfleet_runtime.engine.prefix_cache import PrefixCache

    tokens = 8
    gen = BatchGenerator(model, tokenizer, prefix_cache=PrefixCache(8, 2**30))
    first = _ids(tokenizer, "Tell me about the lighthouse keeper and the long winter at sea " * 2, tokens)
    said = gen.generate([GenerationRequest(first, SamplingParams(max_new_tokens=tokens), session_id="a")])[0]
    others = [
        _ids(tokenizer, f"Question {i}: what do birds sing about? " * (1 + i % 2), tokens) for i in range(4)
    ]
    # the conversation's next turn comes second, so it is prefilled beside a row without a cached prefix
    prompts = [others[0], first + said.token_ids + _ids(tokenizer, "go on")[-2:], *others[1:]]
    longest = max(len(p) for p in prompts) + tokens
    per_position = gen.kv_bytes_per_position()
    prefix = 2**20
    sizing = kv_sizing(
        device_memory=0, loaded_bytes=0, instances=1, fraction=0.9,
        memory_bytes=3 * longest * per_position + prefix, prefix_bytes=prefix, per_position=per_position,
        typical_prompt=longest - tokens, max_new_tokens=tokens, max_rows=256,
    )  # fmt: skip
    assert (sizing.budget, sizing.rows) == (3 * longest * per_position, 3)
    widest = [0]
    for name in ("start", "merge", "step"):  # measure the running batch after every change of its cache
        original = getattr(gen, name)

        def measured(*args, _original=original):
            out = _original(*args)
            batch = out[0] if isinstance(out, tuple) else out
            if batch is not None:
                widest[0] = max(widest[0], _cache_bytes(batch))
            return out

        setattr(gen, name, measured)
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=tokens), session_id="a" if i == 1 else None)
        for i, p in enumerate(prompts)
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gate = _gate(gen)
    engine = InflightEngine(
        gen, max_rows=sizing.rows, kv_budget_bytes=sizing.budget, max_waiting=queue,
        max_wait_s=60.0 if queue else 0.0,
    )  # fmt: skip
    try:
        results = _submit_all(engine, requests, gate)
    finally:
        engine.close()
        torch.set_num_threads(threads)
    assert 0 < widest[0] <= sizing.budget, (widest[0], sizing.budget)
    refused = [e for _, e in results if e is not None]
    if queue:
        assert not refused and all(r.finish_reason in ("stop", "length") for r, _ in results)
    else:
        assert len(refused) == 2, results
        assert all(e.kind == "overloaded" and "kv budget" in str(e) for e in refused)


def test_the_service_sizes_its_engine_from_the_kv_memory_and_refuses_past_it(
    tiny_model_dir, model, tokenizer, caplog
):
    """ChatService resolves the KV memory at load (here kv_memory_bytes: 2 typical rows of budget plus the
    prefix store), logs it, and starts the engine with that budget and row limit (max_batch_size 256 is
    only the cap). 2 + 2 requests with no queue: 2 answered, 2 refused with the `overloaded:` error the
    chat API turns into 429 + Retry-After."""
    import logging

    from chatfleet_runtime.chat.backend import _classify
    from chatfleet_runtime.engine.service import ChatService, ServiceSettings, error_message

    tokens, typical = 8, 40
    per_position = BatchGenerator_per_position(model, tokenizer)
    prefix = 2**20
    settings = ServiceSettings(
        model_dir=str(tiny_model_dir),
        max_batch_size=256,
        max_new_tokens=tokens,
        default_max_tokens=tokens,
        kv_memory_bytes=2 * (typical + tokens) * per_position + prefix,
        prefix_cache_bytes=prefix,
        kv_typical_prompt_tokens=typical,
        admission_queue=0,
        admission_wait_ms=0,
        warmup=False,
        torch_threads=1,
    )
    with caplog.at_level(logging.INFO, logger="chatfleet_runtime.engine.service"):
        service = ChatService(settings, model=model, tokenizer=tokenizer)
    assert (service.kv.budget, service.kv.rows, service.prefix_cache.max_bytes) == (
        2 * (typical + tokens) * per_position,
        2,
        prefix,
    )
    assert any(
        "kv cache: KV memory" in r.message and "running at most 2" in r.message for r in caplog.records
    )
    gate = _gate(service.generator)
    engine = service.start_inflight()
    try:
        assert (engine.max_rows, engine.kv_budget_bytes) == (2, service.kv.budget)
        requests = []
        for i in range(4):
            prep = service.prepare(
                f'[{{"role":"user","content":"hi {i}"}}]'.encode(), b'{"prefix_cache":false}'
            )
            assert prep.request is not None and len(prep.request.prompt_ids) <= typical, prep
            requests.append(prep.request)
        results = _submit_all(service, requests, gate)
    finally:
        service.close()
    refused = [e for _, e in results if e is not None]
    assert len(refused) == 2 and sum(r is not None for r, _ in results) == 2, results
    for e in refused:
        assert _classify(Exception(error_message(e.kind, str(e)))).kind == "overloaded"


def BatchGenerator_per_position(model, tokenizer) -> int:
    """KV bytes per position of the tiny model (as the service computes them)."""
    from chatfleet_runtime.engine.generation import BatchGenerator

    return BatchGenerator(model, tokenizer).kv_bytes_per_position()


def test_the_worked_examples_in_the_docstrings_hold():
    """kv_sizing's and the planner's numeric examples (docs/runtime.md quotes them) are checked, not prose."""
    import doctest

    from chatfleet_runtime.engine import admission, kvsizing

    for module in (kvsizing, admission):
        failed, tried = doctest.testmod(module)
        assert tried > 0 and failed == 0, module.__name__
