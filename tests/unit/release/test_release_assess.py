"""Table tests of the assessor: verdicts of samples, and counters folded into decisions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from chatfleet_operator.analysis.assess import (
    CONTINUE,
    ERROR,
    ERROR_PAUSE,
    FAILED,
    INCONCLUSIVE,
    ROLLBACK,
    SUCCESSFUL,
    Check,
    Measurement,
    Sample,
    assess,
    fmt,
    fold,
)

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
ERR = Check("error rate", "%", max_value=1.0)
LAT = Check("P99 latency", "ms", max_value=500.0, max_ratio_to_stable=1.5)
REL = Check("error rate", "%", max_increase_over_stable=0.5)


@pytest.mark.parametrize(
    ("sample", "checks", "verdict", "message"),
    [
        pytest.param(Sample(NOW, error="connection refused"), [ERR], ERROR, "connection refused", id="error"),
        pytest.param(Sample(NOW, 0.0), [ERR], INCONCLUSIVE, "no traffic", id="no-traffic"),
        pytest.param(
            Sample(NOW, 3.0, {"error rate": 4.2}), [ERR], FAILED, "error rate 4.2% > 1%", id="error-rate"
        ),
        pytest.param(
            Sample(NOW, 3.0, {"error rate": 0.5}), [ERR], SUCCESSFUL, "error rate 0.5% <= 1%", id="pass"
        ),
        pytest.param(
            Sample(NOW, 3.0, {"P99 latency": 400.0}, {"P99 latency": 200.0}),
            [LAT],
            FAILED,
            "P99 latency 400ms > 300ms (stable 200ms)",
            id="latency-relative-to-stable",
        ),
        pytest.param(
            Sample(NOW, 3.0, {"P99 latency": 400.0}, {"P99 latency": None}),
            [LAT],
            SUCCESSFUL,
            "P99 latency 400ms <= 500ms",
            id="latency-absolute-when-stable-has-no-data",
        ),
        pytest.param(
            Sample(NOW, 3.0, {"error rate": 2.0}, {"error rate": 1.8}),
            [REL],
            SUCCESSFUL,
            "error rate 2% <= 2.3% (stable 1.8%)",
            id="relative-increase-passes-when-stable-is-bad-too",
        ),
        pytest.param(
            Sample(NOW, 3.0, {"error rate": None}),
            [ERR],
            SUCCESSFUL,
            "no figures",
            id="figure-no-data-skipped",
        ),
        pytest.param(
            Sample(NOW, 4.0, {"error rate": 2.5}, window_seconds=10),
            [Check("error rate", "%", max_value=1.0, min_failed_requests=2)],
            SUCCESSFUL,
            "error rate 2.5% > 1% (within noise at this traffic)",
            id="one-failed-request-in-40-is-noise",
        ),
        pytest.param(
            Sample(NOW, 4.0, {"error rate": 10.0}, window_seconds=10),
            [Check("error rate", "%", max_value=1.0, min_failed_requests=2)],
            FAILED,
            "error rate 10% > 1%",
            id="four-failed-requests-in-40-fail",
        ),
        pytest.param(
            Sample(NOW, 18.0, {"error rate": 1.11}, window_seconds=10),
            [Check("error rate", "%", max_value=1.0, min_failed_requests=2)],
            SUCCESSFUL,
            "within noise",
            id="two-failed-in-180-at-a-1pct-limit-is-noise",
        ),
        pytest.param(
            Sample(NOW, 18.0, {"error rate": 4.44}, window_seconds=10),
            [Check("error rate", "%", max_value=1.0, min_failed_requests=2)],
            FAILED,
            "error rate 4.44% > 1%",
            id="eight-failed-in-180-fail",
        ),
    ],
)
def test_assess(sample, checks, verdict, message):
    m = assess(sample, checks)
    assert m.verdict == verdict
    assert message in m.message


def _m(verdict: str, message: str = "") -> Measurement:
    figures = ()
    if verdict == FAILED:
        from chatfleet_operator.analysis.assess import Figure

        figures = (Figure("error rate", 4.2, 0.1, 1.0, "%", False),)
        message = message or "error rate 4.2% > 1% (stable 0.1%)"
    return Measurement(NOW, verdict, message or verdict, figures)


@pytest.mark.parametrize(
    ("verdicts", "failure_limit", "error_limit", "decision", "reason"),
    [
        pytest.param([FAILED], 2, 4, CONTINUE, "", id="one-failure-tolerated"),
        pytest.param(
            [FAILED, FAILED],
            2,
            4,
            ROLLBACK,
            "in 2 of 2 checks; failed (2) >= failureLimit (2)",
            id="two-failures",
        ),
        pytest.param([FAILED, SUCCESSFUL, FAILED], 2, 4, ROLLBACK, "in 2 of 3 checks", id="not-consecutive"),
        pytest.param([FAILED], 0, 4, ROLLBACK, "failed (1) >= failureLimit (0)", id="limit-0-first-failure"),
        pytest.param(
            [ERROR, ERROR], 2, 1, ERROR_PAUSE, "errors (2) > consecutiveErrorLimit (1)", id="errors-pause"
        ),
        pytest.param([ERROR, SUCCESSFUL, ERROR], 2, 1, CONTINUE, "", id="errors-reset-by-an-answer"),
        pytest.param([ERROR, ERROR, ERROR, ERROR], 0, 10, CONTINUE, "", id="errors-never-roll-back"),
        pytest.param([INCONCLUSIVE] * 5, 1, 1, CONTINUE, "", id="inconclusive-never-fails"),
    ],
)
def test_fold(verdicts, failure_limit, error_limit, decision, reason):
    counters = None
    for v in verdicts:
        folded = fold(counters, _m(v), failure_limit, error_limit, "2026-11-21T10:00:00Z")
        counters = folded.counters
    assert folded.decision == decision
    assert reason in folded.reason
    assert counters["checks"] == len(verdicts)
    assert counters["errors"] == verdicts.count(ERROR)
    assert counters["failed"] == verdicts.count(FAILED)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [(4.2, "%", "4.2%"), (1234.0, "ms", "1234ms"), (None, "", "n/a"), (0.05, "%", "0.05%")],
)
def test_fmt(value, unit, text):
    assert fmt(value, unit) == text


@pytest.mark.parametrize(
    ("k", "lam", "expected"), [(0, 3.0, 1.0), (2, 1.8, 0.537), (8, 1.8, 0.0006), (1, 0.4, 0.33)]
)
def test_poisson_tail(k, lam, expected):
    from chatfleet_operator.analysis.assess import poisson_tail

    assert poisson_tail(k, lam) == pytest.approx(expected, abs=5e-3)
