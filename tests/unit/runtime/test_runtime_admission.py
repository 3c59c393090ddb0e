"""Admission by KV budget: the pure planner (table) and the in-flight engine applying it.

Test design: the table walks the planner through fit, first-come-first-served blocking, the queue
bound, the wait limit and a request too big to ever fit. The engine test sets a budget of two rows'
worth of KV and submits six long requests at once: two run at a time and the rest wait their turn
(none refused while the queue has room); with a queue of one and no waiting time, the surplus is
refused at once with an `overloaded` error that the chat API turns into 429.
"""

from __future__ import annotations

import threading

import pytest
from chatfleet_runtime.admission import Plan, batch_kv_bytes, fits, kv_bytes_per_position, plan_admission
from chatfleet_runtime.prompting import SamplingParams, render_prompt
from chatfleet_runtime.rows import GenerationRequest


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


def _submit_all(engine, requests):
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
    assert done.wait(120)
    return results


@pytest.mark.parametrize("queue", [8, 1])
def test_engine_holds_the_kv_budget_and_refuses_past_the_queue(model, tokenizer, queue):
    import torch
    from chatfleet_runtime.generation import BatchGenerator
    from chatfleet_runtime.inflight import InflightEngine

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
