"""The runtime benchmark's load and baselines (bench/answer_lengths.py, bench/generate_baseline.py).

Test design: the length draws and the static batcher's bookkeeping are pure and checked on tables; one
test runs real static batches of the tiny model to check that answers are exactly as long as asked and
that short rows are delivered before their batch ends. No speed is asserted (benchmarks are not tests).
"""

from __future__ import annotations

import queue
import statistics
import sys
import threading

import pytest
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from answer_lengths import MIN_TOKENS, answer_length
from generate_baseline import StaticBatcher, closed_loop, collect_batch, row_sample


def test_answer_lengths_are_fixed_per_request_and_mixed():
    draws = [answer_length(k, 128) for k in range(1000)]
    assert draws == [answer_length(k, 128) for k in range(1000)]
    assert all(MIN_TOKENS <= n <= 128 for n in draws)
    assert 28 <= statistics.median(draws) <= 36  # median cap / 4
    assert min(draws) < 12 and draws.count(128) > 10  # short answers and a tail at the cap
    assert [answer_length(k, 128, seed=1) for k in range(20)] != draws[:20]  # another seed


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("waiting", "max_batch", "expected"),
    [
        pytest.param(["a", "b", "c"], 2, ["a", "b"], id="full-batch-at-once"),
        pytest.param(["a", "b"], 8, ["a", "b"], id="takes-what-waits"),
        pytest.param(["a", None, "b"], 8, ["a"], id="stop-ends-the-batch"),
        pytest.param([None], 8, [], id="stop"),
    ],
)
def test_collect_batch(waiting, max_batch, expected):
    jobs: queue.Queue = queue.Queue()
    for job in waiting:
        jobs.put(job)
    clock = FakeClock()
    clock.now = 5.0
    assert collect_batch(jobs, max_batch, 0.0, clock) == expected
    if None in waiting:  # the stop stays queued, so the next call stops too
        assert None in list(jobs.queue)


def test_collect_batch_waits_out_the_window_for_late_jobs():
    jobs: queue.Queue = queue.Queue()
    jobs.put("a")
    threading.Timer(0.05, jobs.put, args=("b",)).start()
    assert collect_batch(jobs, 8, 2.0) == ["a", "b"]  # real clock: b arrives within the window


def test_closed_loop_keeps_every_client_busy_until_the_list_drains():
    in_flight, peak, lock = [0], [0], threading.Lock()

    def submit(k: int) -> dict:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        threading.Event().wait(0.01 * (k % 3))
        with lock:
            in_flight[0] -= 1
        return {"k": k}

    samples, _ = closed_loop(submit, concurrency=4, requests=10)
    assert sorted(s["k"] for s in samples) == list(range(10)) and peak[0] <= 4


def test_row_sample_worked_example():
    sample = row_sample(1.0, 2, [1.5, 1.6, 1.7], 1.8, 3)
    assert sample == pytest.approx({"ttft": 0.5, "latency": 0.6, "batch_end": 0.8, "tokens": 2, "batch": 3})


def test_static_batches_give_exact_lengths_and_deliver_short_rows_early(tiny_model_dir):
    from chatfleet_runtime.engine.loading import choose_placement, load_model, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir, choose_placement("fp32", "KIND_CPU", cuda_available=False))
    lengths = [2, 5, 9, 9, 2, 5]
    batcher = StaticBatcher(model, tokenizer, threads=1, max_batch=3, window_s=1.0)
    try:
        samples, wall = closed_loop(
            lambda k: batcher.submit_and_wait(
                [{"role": "user", "content": f"question {k} " * (k % 3 + 1)}], lengths[k]
            ),
            concurrency=3,
            requests=6,
        )
    finally:
        batcher.close()
    assert sorted(s["tokens"] for s in samples) == sorted(lengths)
    assert all(s["batch"] == 3 for s in samples)  # three clients, batches of three
    for s in samples:
        assert 0 < s["ttft"] <= s["latency"] <= s["batch_end"] <= wall
    short = [s for s in samples if s["tokens"] == 2]
    assert all(s["latency"] < s["batch_end"] for s in short)  # delivered before the 9-token row ended
