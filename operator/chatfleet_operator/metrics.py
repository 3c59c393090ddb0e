"""The operator's own Prometheus metrics: the metric objects, what the I/O edges call, the /metrics server.

Counting happens only at the edges, never in pure code (import-linter keeps builders, planners and the
assessor from importing this module):
  controller.py       passes by result, their duration, the queue, the age of the oldest unfinished pass;
  kube.py             every API request the operator makes, by verb, kind and status code;
  release/measure.py  analysis measurements by verdict, and each figure's outcome by metric name;
  reconcile.py        releases started, promoted and rolled back, read from the pass's release events
                      once its status is written (a pass whose write failed is planned again, not
                      counted twice), and the time from a release's first failed measurement to its
                      rollback.

Labels: no label names a ChatbotService, so the series count does not grow with the fleet; kube-state-
metrics already has a series per object (docs/chart.md "Monitoring"). The labels are small fixed sets
(verdicts, results, strategies, verbs, the kinds in kinds.py, status codes), except `metric` of the
analysis figures: the built-in checks plus the names of spec.analysis.customQueries in use.

Everything lives in prometheus_client's default registry, which also carries the process collectors
(process_cpu_seconds_total, process_resident_memory_bytes, ...). The series of kopf's own watch streams
are not counted: kopf talks to the API server through its own client, not kube.py.

Beside the series, the same edges keep the raw figures `make bench-operator` reads through the CLI's
--stats-file (`raw_figures`): passes and each pass's seconds, each API request's seconds, and writes by
"VERB Kind". The benchmark computes its own percentiles from them, which a histogram's buckets cannot
give; the lists are bounded (the oldest half goes when one is full).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

PREFIX = "chatfleet_operator"

# No `*_created` series beside every counter and histogram: they double the series count and nothing here
# reads them (rate() and increase() handle counter resets).
disable_created_metrics()

#: Results of a pass (label `result`): it ran with nothing to report, it found problems the user or the
#: cluster must solve (it retries with backoff), it raised (ReconcileError), or the namespace is going.
SUCCESS, PROBLEM, ERROR, GONE = "success", "problem", "error", "gone"
#: What asked for a pass (label `trigger`): a kopf handler (create, update, resume; kopf retries it) or a
#: trigger of the operator's own (a child's or a node's watch event, a release's timed wait, a retry).
HANDLER, TRIGGERED = "handler", "triggered"

RECONCILE_PASSES = Counter(
    f"{PREFIX}_reconcile_passes_total",
    "Reconcile passes over a ChatbotService, by what asked for them and their result "
    "(success, problem: waiting for the user or the cluster, error: the pass raised, gone: namespace deleted).",
    ["trigger", "result"],
)
RECONCILE_DURATION = Histogram(
    f"{PREFIX}_reconcile_duration_seconds",
    "Duration of one reconcile pass in its worker thread (an analysis measurement included), seconds.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
QUEUE_DEPTH = Gauge(
    f"{PREFIX}_queue_depth",
    "Passes asked for and not running yet: triggers waiting out their debounce (one per ChatbotService), "
    "and passes waiting for their ChatbotService's lock or a free worker thread.",
)
PASSES_RUNNING = Gauge(f"{PREFIX}_reconcile_running", "Passes running in a worker thread now.")
OLDEST_PASS = Gauge(
    f"{PREFIX}_oldest_pass_seconds",
    "Seconds the oldest unfinished pass has been going, waiting for its lock or a worker thread "
    "included; 0 when none is. A pass that never ends makes it grow (the stuck-reconcile alert).",
)
HANDLERS_HELD = Gauge(
    f"{PREFIX}_handlers_held_seconds",
    "Seconds kopf has held every handler at its start-up gate (a watch not yet listed, or a listed object "
    "not yet indexed), sampled every 10 s; 0 when open. Seconds at a start or a new namespace; a gate "
    "that stays shut leaves every ChatbotService unreconciled (the operator logs the gates it waits for).",
)
API_REQUESTS = Counter(
    f"{PREFIX}_api_requests_total",
    "Kubernetes API requests of the operator (kube.py; not kopf's watches), by verb (GET, APPLY, PATCH, "
    "POST, DELETE), kind and HTTP status code ('error': no response, e.g. connection refused or timeout).",
    ["verb", "kind", "code"],
)
API_REQUEST_DURATION = Histogram(
    f"{PREFIX}_api_request_duration_seconds",
    "Duration of one Kubernetes API request of the operator, by verb, seconds.",
    ["verb"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RELEASES_STARTED = Counter(
    f"{PREFIX}_releases_started_total", "Releases started (a new revision), by strategy.", ["strategy"]
)
RELEASES_PROMOTED = Counter(
    f"{PREFIX}_releases_promoted_total", "Releases promoted to stable, by strategy.", ["strategy"]
)
RELEASES_ROLLED_BACK = Counter(
    f"{PREFIX}_releases_rolled_back_total",
    "Releases rolled back (failed analysis, unhealthy pods, progress deadline or abort), by strategy.",
    ["strategy"],
)
FAILURE_TO_ROLLBACK = Histogram(
    f"{PREFIX}_release_failure_to_rollback_seconds",
    "Seconds from a release's first failed analysis measurement to its rollback (status "
    "release.analysis.firstFailedAt to release.rolledBackAt, whole seconds). Rollbacks without a failed "
    "measurement (pod health, progress deadline, abort) are not observed: they act on first sight.",
    ["strategy"],
    buckets=(0, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1800),
)
ANALYSIS_MEASUREMENTS = Counter(
    f"{PREFIX}_analysis_measurements_total",
    "Release analysis measurements (one per interval), by verdict: Successful, Failed, Inconclusive "
    "(no canary traffic) or Error (the metrics provider did not answer, or a target was refused).",
    ["verdict"],
)
ANALYSIS_FIGURES = Counter(
    f"{PREFIX}_analysis_figures_total",
    "Figures of the release analysis measurements, by metric (error rate, P99 latency, custom query "
    "names, answer checks) and result: ok, failed, or no_data (the figure had no samples).",
    ["metric", "result"],
)

#: The passes started and not finished: a token -> when it started (time.monotonic()).
_unfinished: dict[int, float] = {}
_tokens = itertools.count()
_lock = threading.Lock()


#: The raw figures of raw_figures(), under _lock.
_pass_seconds: list[float] = []
_request_seconds: list[float] = []
_writes: Tally[str] = Tally()
_RAW_LIMIT = 100_000


def _keep(values: list[float], value: float) -> None:
    """Append under _lock; drop the oldest half once the list holds _RAW_LIMIT values."""
    values.append(value)
    if len(values) > _RAW_LIMIT:
        del values[: _RAW_LIMIT // 2]


def raw_figures() -> dict[str, Any]:
    """The benchmark's raw figures: passes run, each one's seconds, API request seconds, writes by kind."""
    with _lock:
        return {
            "passes": len(_pass_seconds),
            "latencies_s": list(_pass_seconds),
            "writes": dict(_writes),
            "request_seconds": list(_request_seconds),
        }


def _oldest_pass_seconds() -> float:
    """Age of the oldest unfinished pass, seconds (0.0 when none), read at scrape time."""
    with _lock:
        oldest = min(_unfinished.values(), default=None)
    return 0.0 if oldest is None else time.monotonic() - oldest


OLDEST_PASS.set_function(_oldest_pass_seconds)


def pass_asked() -> int:
    """A pass was asked for (it now waits for its lock and a worker thread); returns its token."""
    token = next(_tokens)
    with _lock:
        _unfinished[token] = time.monotonic()
    QUEUE_DEPTH.inc()
    return token


def pass_running() -> None:
    """A pass asked for left the queue: it runs in a worker thread now."""
    QUEUE_DEPTH.dec()
    PASSES_RUNNING.inc()


def pass_done(token: int, trigger: str, result: str | None, seconds: float | None, ran: bool) -> None:
    """A pass ended: count it by trigger and result (None: nothing to reconcile, not counted), observe
    its duration (when it ran), and take it off the gauges (`ran`: whether pass_running was called)."""
    with _lock:
        _unfinished.pop(token, None)
        if seconds is not None:
            _keep(_pass_seconds, seconds)
    if ran:
        PASSES_RUNNING.dec()
    else:
        QUEUE_DEPTH.dec()
    if result is not None:
        RECONCILE_PASSES.labels(trigger=trigger, result=result).inc()
    if seconds is not None:
        RECONCILE_DURATION.observe(seconds)


def trigger_queued() -> None:
    """A triggered pass waits out its debounce (repeated asks are merged into it)."""
    QUEUE_DEPTH.inc()


def trigger_due() -> None:
    """A debounced trigger is due: it leaves the debounce (and joins the queue through pass_asked)."""
    QUEUE_DEPTH.dec()


def api_request(verb: str, kind: str, code: str, seconds: float) -> None:
    """Count one Kubernetes API request and observe its duration."""
    API_REQUESTS.labels(verb=verb, kind=kind, code=code).inc()
    API_REQUEST_DURATION.labels(verb=verb).observe(seconds)
    with _lock:
        _keep(_request_seconds, seconds)


def api_write(verb: str, kind: str) -> None:
    """Count one write request the operator sends ("APPLY Deployment", "PATCH status", ...)."""
    with _lock:
        _writes[f"{verb} {kind}"] += 1


def analysis_measured(verdict: str, figures: Iterable[Any]) -> None:
    """Count one analysis measurement and each of its figures (objects with .metric, .canary, .ok)."""
    ANALYSIS_MEASUREMENTS.labels(verdict=verdict).inc()
    for figure in figures:
        result = "no_data" if figure.canary is None else "ok" if figure.ok else "failed"
        ANALYSIS_FIGURES.labels(metric=figure.metric, result=result).inc()


def release_started(strategy: str) -> None:
    """Count a release that started."""
    RELEASES_STARTED.labels(strategy=strategy).inc()


def release_promoted(strategy: str) -> None:
    """Count a release that was promoted."""
    RELEASES_PROMOTED.labels(strategy=strategy).inc()


def release_rolled_back(strategy: str, first_failed: datetime | None, rolled_back: datetime | None) -> None:
    """Count a rollback; with the time of the release's first failed measurement, observe the delay.

    e.g. first failed 10:00:21, rolled back 10:00:31 -> 10 s observed; no failed measurement -> none.
    """
    RELEASES_ROLLED_BACK.labels(strategy=strategy).inc()
    if first_failed is not None and rolled_back is not None:
        FAILURE_TO_ROLLBACK.labels(strategy=strategy).observe(
            max(0.0, (rolled_back - first_failed).total_seconds())
        )


def serve(port: int, address: str = "0.0.0.0") -> int:
    """Serve /metrics (prometheus_client's own HTTP server, a daemon thread); returns the bound port
    (port 0 picks a free one)."""
    server, _ = start_http_server(port, addr=address)
    return int(server.server_port)
