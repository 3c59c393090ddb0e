"""Statistics of the benchmarks: nearest-rank percentiles of the raw figures an operator process dumps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1), e.g. percentile([1, 2, 3, 4], 0.5) == 2; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def operator_figures(dump: Mapping[str, Any]) -> dict[str, Any]:
    """The operator's --stats-file dump with pass and API request latency percentiles (seconds) added."""
    latencies, requests = dump.get("latencies_s") or [], dump.get("request_seconds") or []
    return {
        **dump,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "request_p50_s": percentile(requests, 0.5),
        "request_p99_s": percentile(requests, 0.99),
    }
