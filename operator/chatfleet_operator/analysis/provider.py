"""The Prometheus provider: the only module of the operator that queries metrics. Measurements never raise.

A measurement is a handful of instant queries through prometheus-api-client (canary and stable of each
check, plus the canary's request rate). Any failure -- connection refused, timeout, HTTP 4xx/5xx, a
malformed answer -- becomes Sample(error=...), which the assessor counts as an Error, never a pass.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import requests
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from chatfleet_operator.analysis import queries
from chatfleet_operator.analysis.assess import Check, Sample
from chatfleet_operator.analysis.queries import Target

log = logging.getLogger("chatfleet.analysis")

#: Seconds one query may take before the measurement counts as an error.
QUERY_TIMEOUT_SECONDS = 5
#: An error rate over its limit fails a check only with at least this many failed requests in the window
#: (one failed request among a few dozen is noise, not a regression).
MIN_FAILED_REQUESTS = 2


@dataclass(frozen=True)
class MetricQuery:
    """One check and how to get its figure for a track."""

    check: Check
    promql: Callable[[Target, int], str]


@dataclass(frozen=True)
class MeasurementRequest:
    """Everything one measurement needs: where, which tracks, which checks, which window."""

    address: str
    namespace: str
    service: str
    canary_track: str
    stable_track: str
    window_seconds: int
    metrics: tuple[MetricQuery, ...]


def default_metrics(analysis: Any) -> tuple[MetricQuery, ...]:
    """Error rate, P99 latency, P99 TTFT and the spec's custom queries, with absolute/relative limits."""
    t = analysis.thresholds
    rel = getattr(analysis, "relative", None)
    out = [
        MetricQuery(
            Check(
                "error rate",
                "%",
                max_value=t.error_rate_percent,
                max_increase_over_stable=getattr(rel, "error_rate_increase_percent", None),
                min_failed_requests=MIN_FAILED_REQUESTS,
            ),
            queries.error_rate_percent,
        ),
        MetricQuery(
            Check(
                "P99 latency",
                "ms",
                max_value=float(t.latency_p99_milliseconds),
                max_ratio_to_stable=getattr(rel, "latency_p99_ratio", None),
            ),
            queries.latency_p99,
        ),
        MetricQuery(
            Check(
                "P99 time to first token",
                "ms",
                max_value=float(t.time_to_first_token_p99_milliseconds),
                max_ratio_to_stable=getattr(rel, "ttft_p99_ratio", None),
            ),
            queries.ttft_p99,
        ),
    ]
    for custom in getattr(analysis, "custom_queries", ()) or ():
        query = custom.query
        out.append(
            MetricQuery(
                Check(
                    custom.name,
                    custom.unit,
                    max_value=custom.max_value,
                    min_value=custom.min_value,
                    max_ratio_to_stable=custom.max_ratio_to_stable,
                ),
                lambda tgt, w, q=query: queries.render_custom(q, tgt, w),
            )
        )
    return tuple(out)


class Provider(Protocol):
    """Anything that can take one measurement (Prometheus here, a fake in unit tests)."""

    def measure(self, plan: MeasurementRequest, now: datetime) -> Sample:
        """One measurement of canary vs stable."""
        ...

    def query(self, address: str, promql: str) -> float | None:
        """One instant query of a single figure (None: no series); raises on any failure."""
        ...


def _scalar(result: Sequence[Mapping[str, Any]]) -> float | None:
    """The value of an instant-vector answer with one series; None when empty or NaN."""
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None


class PrometheusProvider:
    """Measures with prometheus-api-client; one client per address, no retries (the next interval is one)."""

    def __init__(self, timeout: float = QUERY_TIMEOUT_SECONDS) -> None:
        self.timeout = timeout
        self._clients: dict[str, PrometheusConnect] = {}

    def _client(self, address: str) -> PrometheusConnect:
        """Cached client of one Prometheus."""
        if address not in self._clients:
            session = requests.Session()
            session.verify = False  # as disable_ssl=True did before a session was passed in
            session.max_redirects = 0  # the checked address is the only one called (a 3xx is an error)
            self._clients[address] = PrometheusConnect(
                url=address.rstrip("/"),
                disable_ssl=True,
                retry=Retry(total=0),
                timeout=self.timeout,
                session=session,
            )
        return self._clients[address]

    def query(self, address: str, promql: str) -> float | None:
        """One instant query (raises on any failure; measure() catches)."""
        return _scalar(self._client(address).custom_query(promql))

    def query_range(
        self, address: str, promql: str, start: datetime, end: datetime, step: int
    ) -> list[tuple[float, float]]:
        """One range query of a single series: [(unix time, value)] (raises on any failure; the caller catches)."""
        result = self._client(address).custom_query_range(
            promql, start_time=start, end_time=end, step=str(step)
        )
        if not result:
            return []
        return [(float(t), float(v)) for t, v in result[0].get("values") or []]

    def measure(self, plan: MeasurementRequest, now: datetime) -> Sample:
        """One measurement of canary vs stable; Sample(error=...) on any failure, never raises."""
        canary = Target(plan.namespace, plan.service, plan.canary_track)
        stable = Target(plan.namespace, plan.service, plan.stable_track)
        try:
            rps = self.query(plan.address, queries.request_rate(canary, plan.window_seconds)) or 0.0
            canary_figures: dict[str, float | None] = {}
            stable_figures: dict[str, float | None] = {}
            for metric in plan.metrics:
                name = metric.check.name
                canary_figures[name] = self.query(plan.address, metric.promql(canary, plan.window_seconds))
                stable_figures[name] = self.query(plan.address, metric.promql(stable, plan.window_seconds))
            return Sample(now, rps, canary_figures, stable_figures, window_seconds=plan.window_seconds)
        except Exception as exc:  # never raise: an unreachable Prometheus is an Error measurement
            message = f"Prometheus at {plan.address} did not answer: {_short(exc)}"
            log.info("Measured %s/%s: %s", plan.namespace, plan.service, message)
            return Sample(now, error=message)


def short_error(exc: BaseException) -> str:
    """First line of an exception, without the long urllib3 chains (public name of _short)."""
    return _short(exc)


def _short(exc: BaseException) -> str:
    """First line of an exception, without the long urllib3 chains."""
    full = str(exc)
    text = full.splitlines()[0] if full else type(exc).__name__
    if "Connection refused" in full:
        return "connection refused"
    if "NameResolution" in full or "resolve" in full:
        return "host name not resolved"
    if "timed out" in full.lower() or "Timeout" in full:
        return "timed out"
    if "Max retries exceeded" in full or "NewConnectionError" in full:
        return "unreachable"
    return text[:200]


def measurement_request(
    namespace: str, service: str, spec: Any, canary_track: str, stable_track: str = "stable"
) -> MeasurementRequest:
    """The measurement plan of one ChatbotService from its spec (window: two intervals, at least 10 s)."""
    a = spec.analysis
    return MeasurementRequest(
        address=a.prometheus_address,
        namespace=namespace,
        service=service,
        canary_track=canary_track,
        stable_track=stable_track,
        window_seconds=queries.window_seconds(a.interval_seconds),
        metrics=default_metrics(a),
    )
