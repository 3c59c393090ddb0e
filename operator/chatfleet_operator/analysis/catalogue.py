"""The metric catalogue: what the release analysis measures, as data. Pure.

Each built-in metric names its unit, the PromQL that gives its figure for a track, its direction (a
ceiling: the canary fails above the limit; a floor: below it) and the spec fields that set its absolute
and its stable-relative limit. `metric_queries` turns a spec.analysis into the checks of a measurement,
the built-ins first, then spec.analysis.customQueries. A new built-in metric is one entry here, its PromQL
in queries.py, and its spec field (spec/analysis.py and the CRD).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from chatfleet_operator.analysis import queries
from chatfleet_operator.analysis.assess import Check
from chatfleet_operator.analysis.queries import Target
from chatfleet_operator.spec import AnalysisSpec

#: An error rate over its limit fails a check only with at least this many failed requests in the window
#: (one failed request among a few dozen is noise, not a regression).
MIN_FAILED_REQUESTS = 2

CEILING, FLOOR = "ceiling", "floor"
#: How a stable-relative limit is spelt: canary <= stable * ratio (or >= for a floor), canary <= stable + n.
RATIO, INCREASE = "ratio", "increase"

Limit = Callable[[AnalysisSpec], float | None]


@dataclass(frozen=True)
class MetricQuery:
    """One check and how to get its figure for a track."""

    check: Check
    promql: Callable[[Target, int], str]


@dataclass(frozen=True)
class Metric:
    """One built-in metric of the analysis."""

    name: str
    """As the status, events and `kubectl chatbot status` show it (e.g. "P99 latency")."""
    unit: str
    promql: Callable[[Target, int], str]
    direction: str
    """CEILING or FLOOR."""
    absolute: Limit
    """The spec field of its absolute limit (None: none)."""
    relative: Limit = lambda _analysis: None
    """The spec field of its limit relative to stable (None: none)."""
    relative_kind: str = RATIO
    min_failed_requests: float | None = None
    """A ceiling on a rate of failures only fails with at least this many failures in the window."""

    def check(self, analysis: AnalysisSpec) -> Check:
        """This metric's check under `analysis`' limits."""
        absolute, relative = self.absolute(analysis), self.relative(analysis)
        if self.direction == FLOOR:
            return Check(self.name, self.unit, min_value=absolute, min_ratio_to_stable=relative)
        return Check(
            self.name,
            self.unit,
            max_value=absolute,
            max_ratio_to_stable=relative if self.relative_kind == RATIO else None,
            max_increase_over_stable=relative if self.relative_kind == INCREASE else None,
            min_failed_requests=self.min_failed_requests,
        )


BUILT_IN: tuple[Metric, ...] = (
    Metric(
        "error rate",
        "%",
        queries.error_rate_percent,
        CEILING,
        absolute=lambda a: a.thresholds.error_rate_percent,
        relative=lambda a: a.relative.error_rate_increase_percent,
        relative_kind=INCREASE,
        min_failed_requests=MIN_FAILED_REQUESTS,
    ),
    Metric(
        "P99 latency",
        "ms",
        queries.latency_p99,
        CEILING,
        absolute=lambda a: float(a.thresholds.latency_p99_milliseconds),
        relative=lambda a: a.relative.latency_p99_ratio,
    ),
    Metric(
        "P99 time to first token",
        "ms",
        queries.ttft_p99,
        CEILING,
        absolute=lambda a: float(a.thresholds.time_to_first_token_p99_milliseconds),
        relative=lambda a: a.relative.ttft_p99_ratio,
    ),
)


def metric_queries(analysis: AnalysisSpec) -> tuple[MetricQuery, ...]:
    """The checks of one measurement: the built-in metrics, then spec.analysis.customQueries."""
    out = [MetricQuery(m.check(analysis), m.promql) for m in BUILT_IN]
    for custom in analysis.custom_queries:
        check = Check(
            custom.name,
            custom.unit,
            max_value=custom.max_value,
            min_value=custom.min_value,
            max_ratio_to_stable=custom.max_ratio_to_stable,
        )
        out.append(MetricQuery(check, lambda tgt, w, q=custom.query: queries.render_custom(q, tgt, w)))
    return tuple(out)
