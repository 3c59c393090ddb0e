"""The runtime benchmark's pure figures (bench/serving_stats.py) and its request mix (bench/runtime_bench.py).

Test design: every helper is pure and checked on worked examples (the ones in its docstring); no model
runs and no speed is asserted (benchmarks are not tests).
"""

from __future__ import annotations

import sys

import pytest
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from generate_baseline import length_groups, step_gaps
from serving_stats import (
    best_peer,
    goals,
    inter_token_gaps,
    memory_summary,
    pct,
    quarter_means,
    quarters,
    summarize,
)

pytestmark = pytest.mark.harness


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([1, 2, 3, 4, 5], 50, 3, id="median"),
        pytest.param([5, 1, 4, 2, 3], 99, 5, id="p99-is-the-max-of-few"),
        pytest.param([5, 1, 4, 2, 3], 0, 1, id="p0-is-the-min"),
        pytest.param([7.0], 99, 7.0, id="one-value"),
        pytest.param([], 50, 0.0, id="empty"),
    ],
)
def test_pct(values, q, expected):
    assert pct(values, q) == expected


@pytest.mark.parametrize(
    ("times", "tokens", "expected"),
    [
        pytest.param([1.0, 1.1, 1.3], None, [0.1, 0.2], id="one-token-per-event"),
        pytest.param([1.0, 1.1, 1.3], [1, 1, 2], [0.1, 0.1, 0.1], id="an-event-of-two-tokens"),
        pytest.param([1.0], None, [], id="first-token-only"),
        pytest.param([], None, [], id="nothing-streamed"),
    ],
)
def test_inter_token_gaps(times, tokens, expected):
    assert inter_token_gaps(times, tokens) == pytest.approx(expected)


def test_step_gaps_stop_at_the_rows_own_length():
    assert step_gaps([1.5, 1.6, 1.8, 2.0], 3) == pytest.approx([0.1, 0.2])
    assert step_gaps([1.5, 1.6], 1) == []


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        pytest.param([20, 1030, 25], [[0, 2], [1]], id="long-history-apart"),
        pytest.param([20, 25], [[0, 1]], id="all-short"),
        pytest.param([1030], [[0]], id="one-long"),
    ],
)
def test_length_groups(lengths, expected):
    assert length_groups(lengths) == expected


def test_summarize_takes_ttft_and_gaps_from_streamed_requests_only():
    samples = [
        {"tokens": 10, "asked": 10, "latency": 1.0, "stream": True, "ttft": 0.2, "gaps": [0.1, 0.1]},
        {"tokens": 10, "asked": 12, "latency": 2.0, "stream": False},
    ]
    f = summarize(samples, 2.0)
    assert f["tokens_per_s"] == 10.0 and f["requests"] == 2 and f["streamed"] == 1
    assert f["ttft_ms_p99"] == 200.0 and f["itl_ms_p50"] == 100.0
    assert f["latency_ms_p99"] == 2000.0 and f["length_mismatches"] == 1


def test_memory_summary():
    assert memory_summary([(0, 100), (0.5, 140), (1, 120)]) == {
        "rss_mib_first": 100,
        "rss_mib_peak": 140,
        "rss_mib_last": 120,
    }


def level(tok_s: float, ttft_p99: float) -> dict:
    return {"tokens_per_s": tok_s, "ttft_ms_p99": ttft_p99}


def test_best_peer_is_the_fastest_measured_at_that_level():
    figures = {"a": {"32": level(5, 1)}, "b": {"32": level(9, 1)}, "c": {"8": level(99, 1)}}
    assert best_peer(figures, "32", ["a", "b", "c"]) == "b"
    assert best_peer(figures, "64", ["a", "b"]) is None


def test_goals_worked_example():
    figures = {
        "runtime": {"32": level(150, 800)},
        "llama": {"32": level(100, 900)},
        "static": {"32": level(40, 9000)},
    }
    g = goals(figures, ["llama", "static"])
    assert g["best_peer"] == "llama"
    assert g["throughput_vs_best"] == 1.5 and g["throughput_met"]
    assert g["ttft_p99_vs_best"] == 0.89 and g["ttft_met"]
    assert not g["old_engine_met"] and g["old_engine_gap_tok_s"] == 60.0


def test_goals_without_runtime_figures_say_so():
    assert "runtime_tok_s" not in goals({"llama": {"32": level(1, 1)}}, ["llama"])


def test_quarters_per_second():
    assert quarters([(0.5, 4), (1.5, 4), (7, 2)], 8) == (4.0, 1.0)
    assert quarters([(9, 5)], 8) == (0.0, 0.0)  # after the end: not counted


def test_quarter_means():
    assert quarter_means([(0, 100), (1, 110), (6.5, 120), (7.5, 130)], 8) == (105.0, 125.0)
    assert quarter_means([], 8) == (0.0, 0.0)


def test_request_mix_half_streamed_one_in_eight_long():
    from runtime_bench import long_history, streamed

    ks = range(64)
    assert sum(streamed(k) for k in ks) == 32
    longs = [k for k in ks if long_history(k)]
    assert longs == [7, 15, 23, 31, 39, 47, 55, 63]
    assert sum(streamed(k) for k in longs) == 4  # the long ones stream half the time too
