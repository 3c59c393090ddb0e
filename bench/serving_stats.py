"""Pure figures of the runtime benchmark: percentiles, inter-token gaps, a level's summary, goals, soak quarters.

Every function here takes measurements (seconds, tokens, MiB) and returns numbers; nothing runs a model,
so all of it is checked on tables in tests/unit/runtime/test_runtime_bench_stats.py.
"""

from __future__ import annotations

from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a list, 0.0 when empty, e.g. pct([1, 2, 3, 4, 5], 50) == 3."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def inter_token_gaps(times: Sequence[float], tokens: Sequence[int] | None = None) -> list[float]:
    """Gaps between successive streamed events, each split evenly over the tokens its event carried.

    ``times`` are the arrival times of the events that carried answer text (the first is the first token,
    so it starts no gap); ``tokens[i]`` is how many tokens event i carried (1 each when None). E.g. events
    at [1.0, 1.1, 1.3] -> [0.1, 0.2]; with tokens [1, 1, 2] -> [0.1, 0.1, 0.1] (the last event's 0.2 s
    made two tokens).
    """
    gaps: list[float] = []
    for i in range(1, len(times)):
        n = 1 if tokens is None else max(1, tokens[i])
        gaps += [(times[i] - times[i - 1]) / n] * n
    return gaps


def summarize(samples: list[dict], wall_s: float) -> dict:
    """One system at one level: tokens/s over the wall time, TTFT and ITL (streamed requests), latency (all).

    A sample is ``{"tokens", "latency", "stream": bool, "ttft" (streamed), "gaps" (streamed, seconds),
    "asked" (optional: the length asked)}``. Percentiles are in milliseconds. E.g. two requests of 10
    tokens in 2 s -> tokens_per_s 10.0.
    """
    streamed = [s for s in samples if s.get("stream")]
    ttft = [s["ttft"] * 1000 for s in streamed]
    gaps = [g * 1000 for s in streamed for g in s.get("gaps", ())]
    lat = [s["latency"] * 1000 for s in samples]
    tokens = sum(s["tokens"] for s in samples)
    out = {
        "requests": len(samples),
        "streamed": len(streamed),
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(tokens / wall_s, 1) if wall_s > 0 else 0.0,
        "ttft_ms_p50": round(pct(ttft, 50), 1),
        "ttft_ms_p99": round(pct(ttft, 99), 1),
        "itl_ms_p50": round(pct(gaps, 50), 1),
        "itl_ms_p99": round(pct(gaps, 99), 1),
        "latency_ms_p50": round(pct(lat, 50), 1),
        "latency_ms_p99": round(pct(lat, 99), 1),
    }
    if samples and all("asked" in s for s in samples):
        out["length_mismatches"] = sum(s["tokens"] != s["asked"] for s in samples)
    return out


def memory_summary(series: Sequence[tuple[float, float]]) -> dict:
    """(seconds, MiB) samples -> first, peak and last MiB, e.g. [(0, 100), (0.5, 140), (1, 120)] -> 100/140/120."""
    if not series:
        return {"rss_mib_first": 0.0, "rss_mib_peak": 0.0, "rss_mib_last": 0.0}
    return {
        "rss_mib_first": round(series[0][1], 1),
        "rss_mib_peak": round(max(m for _, m in series), 1),
        "rss_mib_last": round(series[-1][1], 1),
    }


def ratio(a: float, b: float) -> float | None:
    """a / b rounded to 2 places, None when b is 0, e.g. ratio(3, 2) == 1.5."""
    return round(a / b, 2) if b else None


def best_peer(figures: dict[str, dict], level: str, peers: Sequence[str]) -> str | None:
    """The peer with the most tokens/s at a level (among those measured there), None when none was.

    E.g. {"a": {"32": {"tokens_per_s": 5}}, "b": {"32": {"tokens_per_s": 9}}} -> "b".
    """
    measured = [p for p in peers if level in figures.get(p, {})]
    return max(measured, key=lambda p: figures[p][level]["tokens_per_s"], default=None)


def goals(
    figures: dict[str, dict], peers: Sequence[str], *, level: str = "32", old_tok_s: float = 70.0
) -> dict:
    """The issue's goals at one level: tokens/s >= 1.0x the best peer at <= its p99 TTFT; >= 3x old_tok_s.

    E.g. runtime 150 tok/s, TTFT p99 800 ms; best peer 100 tok/s at 900 ms -> throughput 1.5x (met),
    p99 TTFT 0.89x (met); 150 < 3 x 70 = 210 -> the old-engine goal is not met, gap 60 tok/s.
    """
    rt = figures.get("runtime", {}).get(level)
    out: dict = {"level": int(level), "old_engine_tok_s": old_tok_s, "target_tok_s": 3 * old_tok_s}
    if rt is None:
        return out
    out["runtime_tok_s"] = rt["tokens_per_s"]
    out["old_engine_ratio"] = ratio(rt["tokens_per_s"], old_tok_s)
    out["old_engine_met"] = rt["tokens_per_s"] >= 3 * old_tok_s
    out["old_engine_gap_tok_s"] = round(max(0.0, 3 * old_tok_s - rt["tokens_per_s"]), 1)
    best = best_peer(figures, level, peers)
    if best is not None:
        peer = figures[best][level]
        thr = ratio(rt["tokens_per_s"], peer["tokens_per_s"])
        ttft = ratio(rt["ttft_ms_p99"], peer["ttft_ms_p99"])
        out |= {
            "best_peer": best,
            "best_peer_tok_s": peer["tokens_per_s"],
            "throughput_vs_best": thr,
            "ttft_p99_vs_best": ttft,
            "throughput_met": thr is not None and thr >= 1.0,
            "ttft_met": ttft is not None and ttft <= 1.0,
        }
    return out


def quarters(events: Sequence[tuple[float, float]], duration_s: float) -> tuple[float, float]:
    """Sum of values that fell in the first and in the last quarter of [0, duration_s), per second.

    ``events`` are (seconds since start, value), e.g. tokens delivered at that time. E.g. duration 8,
    events [(0.5, 4), (1.5, 4), (7, 2)] -> (8 / 2, 2 / 2) == (4.0, 1.0).
    """
    q = duration_s / 4
    first = sum(v for t, v in events if 0 <= t < q)
    last = sum(v for t, v in events if duration_s - q <= t < duration_s)
    return (first / q, last / q) if q > 0 else (0.0, 0.0)


def quarter_means(series: Sequence[tuple[float, float]], duration_s: float) -> tuple[float, float]:
    """Mean of the samples in the first and the last quarter of [0, duration_s] (0.0 for an empty quarter).

    E.g. duration 8, samples [(0, 100), (1, 110), (6.5, 120), (7.5, 130)] -> (105.0, 125.0).
    """
    q = duration_s / 4
    first = [v for t, v in series if t < q]
    last = [v for t, v in series if t >= duration_s - q]
    return (
        sum(first) / len(first) if first else 0.0,
        sum(last) / len(last) if last else 0.0,
    )
