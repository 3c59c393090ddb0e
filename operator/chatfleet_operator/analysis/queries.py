"""PromQL for release analysis, built from the metric names of docs/metrics.md. Pure: strings in, out.

Track labels: Prometheus must attach `namespace` and `track` labels to the pods' series (relabelled from
the pod's namespace and its `chatfleet.io/track` label; docs/releases.md shows the scrape config). The
runtime's own `model` label carries the ChatbotService name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Outcomes of chatfleet_requests_total that count as errors: failed requests and fallback answers.
ERROR_OUTCOMES = "error|fallback"


@dataclass(frozen=True)
class Target:
    """Which series one track of one ChatbotService has."""

    namespace: str
    service: str
    track: str

    def selector(self, extra: str = "") -> str:
        """Label matchers, e.g. namespace="ns",model="bot",track="canary"."""
        base = f'namespace="{self.namespace}",model="{self.service}",track="{self.track}"'
        return f"{base},{extra}" if extra else base


def window_seconds(interval_seconds: int) -> int:
    """rate() window: two intervals, at least 10 s (1 s scrapes need two samples); e.g. 5 -> 10, 30 -> 60."""
    return max(10, 2 * interval_seconds)


def request_rate(t: Target, window: int) -> str:
    """Requests per second of one track."""
    return f"sum(rate(chatfleet_requests_total{{{t.selector()}}}[{window}s]))"


def requests_within(t: Target, seconds: int) -> str:
    """Requests one track served in the last `seconds` (0 when none; no series reads as none)."""
    return f"sum(increase(chatfleet_requests_total{{{t.selector()}}}[{seconds}s]))"


def error_rate_percent(t: Target, window: int) -> str:
    """Share of requests that failed or fell back, percent."""
    matcher = 'outcome=~"' + ERROR_OUTCOMES + '"'
    errors = f"sum(rate(chatfleet_requests_total{{{t.selector(matcher)}}}[{window}s]))"
    return f"100 * ({errors} or vector(0)) / {request_rate(t, window)}"


def p99_milliseconds(metric: str, t: Target, window: int) -> str:
    """P99 of a histogram in milliseconds, e.g. chatfleet_request_duration_seconds."""
    return (
        f"1000 * histogram_quantile(0.99, sum by (le) (rate({metric}_bucket{{{t.selector()}}}[{window}s])))"
    )


def latency_p99(t: Target, window: int) -> str:
    """P99 whole-response latency, milliseconds."""
    return p99_milliseconds("chatfleet_request_duration_seconds", t, window)


def ttft_p99(t: Target, window: int) -> str:
    """P99 time to first token, milliseconds."""
    return p99_milliseconds("chatfleet_time_to_first_token_seconds", t, window)


def render_custom(query: str, t: Target, window: int) -> str:
    """A spec query with placeholders filled: {{namespace}}, {{service}}, {{track}}, {{window}}."""
    values: Mapping[str, str] = {
        "namespace": t.namespace,
        "service": t.service,
        "track": t.track,
        "window": f"{window}s",
    }
    for key, value in values.items():
        query = query.replace("{{" + key + "}}", value)
    return query
