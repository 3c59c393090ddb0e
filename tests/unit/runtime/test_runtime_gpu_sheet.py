"""The GPU sheet's measuring (bench/gpu_sheet.py), run on the CPU with the tiny model.

Test design: the closed loop drives a real ChatService; what is checked is the bookkeeping that the
published figures rest on (requests counted in the window, every one followed to its end, TTFT and
inter-token gaps from the streamed tokens) and the table and capacity lines drawn from them. No speed is
asserted (benchmarks are not tests).
"""

from __future__ import annotations

import json
import sys

import pytest
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from gpu_sheet import ClosedLoop, Prompts, percentile, render

pytestmark = pytest.mark.harness


def test_requests_are_the_same_for_every_case_and_mixed():
    prompts = Prompts()
    first = [prompts.request(k) for k in range(16)]
    assert first == [Prompts().request(k) for k in range(16)]
    lengths = {len(json.loads(messages)) for messages, _ in first}
    assert lengths == {2, 10}  # system + user; one in eight carries four earlier turns


def test_percentile_is_nearest_rank():
    assert percentile([], 90) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(x) for x in range(1, 101)], 90) == 90.0


def test_the_closed_loop_counts_window_requests_to_their_end(tiny_model_dir):
    from chatfleet_runtime.engine.service import ChatService, ServiceSettings

    service = ChatService(
        ServiceSettings(
            model_dir=str(tiny_model_dir), max_batch_size=4, stream_interval_ms=0, max_new_tokens=256
        )
    )
    service.start_inflight()
    try:
        loop = ClosedLoop(service, Prompts(), clients=3, seconds=1.5, warmup_s=0.5)
        figures = loop.run()
    finally:
        service.close()
    assert figures["requests"] >= 1 and figures["refused"] == 0
    assert loop.outstanding == 0  # every request answered before the level ends
    window = [r for r in loop.records if loop.start + 0.5 <= r.sent < loop.stop_at]
    assert len(window) == figures["requests"]
    # each streamed piece holds one token or more (a piece waits for a whole character)
    assert all(1 <= len(r.texts) <= r.tokens and r.done >= r.texts[-1] for r in window)
    assert figures["ttft_ms"][50] is not None and figures["itl_ms"][50] is not None
    assert figures["tokens_per_s"] > 0


def test_the_table_names_the_device_and_the_capacity_from_the_slo():
    level = {
        "clients": 32,
        "tokens_per_s": 100.0,
        "ttft_ms": {50: 100.0, 90: 250.0, 99: 400.0},
        "itl_ms": {50: 10.0, 99: 30.0},
        "refused": 0,
        "peak_allocated_gib": 2.0,
    }
    slow = {**level, "clients": 64, "ttft_ms": {50: 200.0, 90: 900.0, 99: 1000.0}}
    data = {
        "environment": {"gpu": "NVIDIA H100 80GB HBM3", "settings": {"ttft_slo_ms": 300}},
        "cases": [{"shape": "0.5b", "asked": "bf16", "runs": "bf16 on cuda", "levels": [level, slow]}],
        "skipped": ["7b bf16: out of time (40 s left)"],
    }
    text = render(data)
    assert text.startswith("GPU: NVIDIA H100 80GB HBM3")
    assert "| 0.5b | bf16 → bf16 on cuda | 32 | 100.0 | 100.0 / 250.0 / 400.0 |" in text
    assert "- 0.5b bf16 on cuda: 32" in text  # 64 missed the 300 ms p90
    assert "- skipped: 7b bf16: out of time" in text
