"""The pure assessor: one sample of figures -> a verdict; verdicts folded into counters -> a decision.

Rules:
- a figure over its threshold makes the measurement Failed; failures roll the release back once
  `failed >= failureLimit` (Flagger's counting: failureLimit 2 rolls back at the 2nd failed check; 0 at
  the 1st);
- no canary traffic in the window is Inconclusive: never a pass, the release waits (or probes);
- a provider error (Prometheus unreachable, a bad query) is an Error, counted apart from failures: it
  never passes and never rolls back; more than consecutiveErrorLimit in a row marks the release paused
  until Prometheus answers again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SUCCESSFUL, FAILED, INCONCLUSIVE, ERROR = "Successful", "Failed", "Inconclusive", "Error"

#: Decisions of fold().
CONTINUE, ROLLBACK, ERROR_PAUSE = "Continue", "Rollback", "ErrorPause"


@dataclass(frozen=True)
class Check:
    """One gate: a figure of the canary against a ceiling and/or a floor, each absolute and/or relative to
    stable (a floor: e.g. tokens/s must not drop below 0.8x stable's)."""

    name: str
    unit: str = ""
    max_value: float | None = None
    max_ratio_to_stable: float | None = None
    max_increase_over_stable: float | None = None
    min_value: float | None = None
    min_failed_requests: float | None = None
    min_ratio_to_stable: float | None = None

    def limit(self, stable: float | None) -> float | None:
        """The ceiling in force: the smallest of the absolute and stable-relative ones (None: no ceiling)."""
        limits = [self.max_value] if self.max_value is not None else []
        if stable is not None and math.isfinite(stable):
            if self.max_ratio_to_stable is not None:
                limits.append(stable * self.max_ratio_to_stable)
            if self.max_increase_over_stable is not None:
                limits.append(stable + self.max_increase_over_stable)
        return min(limits) if limits else None

    def floor(self, stable: float | None) -> float | None:
        """The floor in force: the largest of the absolute and stable-relative ones (None: no floor).

        e.g. min_value 10, min_ratio_to_stable 0.8, stable 50 -> 40; stable unknown -> 10.
        """
        floors = [self.min_value] if self.min_value is not None else []
        if stable is not None and math.isfinite(stable) and self.min_ratio_to_stable is not None:
            floors.append(stable * self.min_ratio_to_stable)
        return max(floors) if floors else None


@dataclass(frozen=True)
class Sample:
    """What the provider measured once: canary and stable figures by check name, or an error."""

    at: datetime
    canary_requests_per_second: float = 0.0
    canary: Mapping[str, float | None] = field(default_factory=dict)
    stable: Mapping[str, float | None] = field(default_factory=dict)
    error: str | None = None
    window_seconds: float = 0.0


@dataclass(frozen=True)
class Figure:
    """One compared figure, kept in status so `kubectl chatbot status` can show it."""

    metric: str
    canary: float | None
    stable: float | None
    limit: float | None
    unit: str
    ok: bool

    def text(self) -> str:
        """e.g. 'error rate 4.2% > 1%' or 'P99 latency 420ms <= 5000ms (stable 380ms)'."""
        if self.canary is None:
            return f"{self.metric}: no data"
        op = "<=" if self.ok else ">"
        if self.limit is not None and self.ok is False and self.canary < self.limit:
            op = "<"
        noise = self.ok and self.limit is not None and self.canary > self.limit
        if noise:
            op = ">"
        limit = f" {op} {fmt(self.limit, self.unit)}" if self.limit is not None else ""
        limit += " (within noise at this traffic)" if noise else ""
        stable = f" (stable {fmt(self.stable, self.unit)})" if self.stable is not None else ""
        return f"{self.metric} {fmt(self.canary, self.unit)}{limit}{stable}"

    @classmethod
    def from_status(cls, stored: Mapping[str, Any]) -> Figure:
        """A figure as status.release.analysis.figures keeps it (to_status's inverse; a hand edit that is
        no number reads as absent)."""

        def number(key: str) -> float | None:
            value = stored.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        return cls(
            str(stored.get("metric", "")),
            number("canary"),
            number("stable"),
            number("limit"),
            str(stored.get("unit", "")),
            stored.get("ok") is True,
        )

    def to_status(self) -> dict[str, Any]:
        """camelCase dict for status.release.analysis.figures."""
        out: dict[str, Any] = {"metric": self.metric, "ok": self.ok, "unit": self.unit}
        for key, value in (("canary", self.canary), ("stable", self.stable), ("limit", self.limit)):
            if value is not None:
                out[key] = round(value, 4)
        return out


@dataclass(frozen=True)
class Measurement:
    """The verdict of one sample, with its figures and a one-line message."""

    at: datetime
    verdict: str
    message: str
    figures: tuple[Figure, ...] = ()

    @property
    def failed_metrics(self) -> list[str]:
        """Names of the checks this measurement failed."""
        return [f.metric for f in self.figures if not f.ok]


def fmt(value: float | None, unit: str) -> str:
    """Compact figure: fmt(4.2, '%') == '4.2%', fmt(1234.0, 'ms') == '1234ms', fmt(None, '') == 'n/a'."""
    if value is None or not math.isfinite(value):
        return "n/a"
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text}{unit}"


def assess(sample: Sample, checks: Sequence[Check], min_requests_per_second: float = 0.0) -> Measurement:
    """Verdict of one sample.

    Examples (error rate ceiling 1%):
    - error -> Error; canary 0 req/s -> Inconclusive ("no traffic");
    - canary 4.2% -> Failed "error rate 4.2% > 1%"; canary 0.5% -> Successful;
    - 1 failed request in 40 (2.5%) with min_failed_requests 2 -> noise, Successful; 2 in 180 (1.1%)
      is noise too (that many failures are likely at exactly 1%); 8 in 180 (4.4%) fails;
    - a figure with no data (e.g. TTFT without streaming requests) is skipped, not failed.
    """
    if sample.error is not None:
        return Measurement(sample.at, ERROR, sample.error)
    rps = sample.canary_requests_per_second
    if not math.isfinite(rps) or rps <= min_requests_per_second or rps <= 0:
        return Measurement(sample.at, INCONCLUSIVE, "no traffic on the canary in the analysis window")
    figures = []
    for check in checks:
        canary, stable = sample.canary.get(check.name), sample.stable.get(check.name)
        canary = canary if canary is not None and math.isfinite(canary) else None
        stable = stable if stable is not None and math.isfinite(stable) else None
        limit = check.limit(stable)
        ok = True
        if canary is not None:
            if limit is not None and canary > limit:
                ok = _noise(check, canary, rps * sample.window_seconds)  # over the limit: fails unless noise
            floor = check.floor(stable)
            if floor is not None and canary < floor:
                ok, limit = False, floor
        figures.append(Figure(check.name, canary, stable, limit, check.unit, ok))
    bad = [f for f in figures if not f.ok]
    if bad:
        return Measurement(sample.at, FAILED, "; ".join(f.text() for f in bad), tuple(figures))
    shown = "; ".join(f.text() for f in figures if f.canary is not None) or "no figures"
    return Measurement(sample.at, SUCCESSFUL, shown, tuple(figures))


#: Which verdict wins when two measurements of one interval are combined: a failure anywhere fails.
_PRECEDENCE = (FAILED, ERROR, INCONCLUSIVE, SUCCESSFUL)


def combine(first: Measurement, second: Measurement) -> Measurement:
    """One interval's verdict from two measurements of it (the metrics', the answers').

    The worse verdict wins (Failed > Error > Inconclusive > Successful), so a canary with perfect HTTP
    metrics but wrong answers fails, and answers alone never pass a canary whose metrics saw no traffic.
    The message names both parts, the failing or erring one first; the figures are both sets.
    e.g. Successful "error rate 0%" + Failed "answer agreement 12% < 100%" -> Failed
    "answer agreement 12% < 100%; error rate 0%".
    """
    a, b = sorted((first, second), key=lambda m: _PRECEDENCE.index(m.verdict))
    message = a.message if a.message == b.message else f"{a.message}; {b.message}"
    return Measurement(first.at, a.verdict, message, (*first.figures, *second.figures))


def poisson_tail(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam), e.g. poisson_tail(2, 1.8) ~= 0.54, poisson_tail(0, x) == 1."""
    if k <= 0:
        return 1.0
    term = cdf = math.exp(-lam)
    for i in range(1, k):
        term *= lam / i
        cdf += term
    return max(0.0, 1.0 - cdf)


def _noise(check: Check, percent: float, requests: float) -> bool:
    """Over the limit, but not significantly: the failed requests are what the limit itself allows.

    A rate check (min_failed_requests set) fails only when its failed requests would be unlikely
    (p < 5%) at exactly the limit's rate, and there are at least min_failed_requests of them. E.g. limit
    1%, 180 requests: 2 failed (1.1%) is noise (P = 0.54 at 1%); 8 failed (4.4%) fails (P < 0.001).
    """
    if check.min_failed_requests is None or requests <= 0:
        return False
    failed = round(percent / 100 * requests)
    if failed < check.min_failed_requests:
        return True
    limit = check.max_value if check.max_value is not None else percent
    return poisson_tail(failed, requests * limit / 100) > 0.05


def empty_counters() -> dict[str, Any]:
    """Analysis counters of a release that has not been measured yet."""
    return {"checks": 0, "successful": 0, "failed": 0, "errors": 0, "consecutiveErrors": 0, "inconclusive": 0}


#: The integer counters of status.release.analysis.
_COUNTERS = ("checks", "successful", "failed", "errors", "consecutiveErrors", "inconclusive")


def counters_from_status(stored: Mapping[str, Any]) -> dict[str, Any]:
    """status.release.analysis as read back: a counter that is no integer (a hand edit) is dropped.

    Dropped counters read as 0 again (`fold` starts from empty_counters()), so a malformed status never
    raises. e.g. {"checks": 2, "failed": "x"} -> {"checks": 2}; failuresByMetric {"e": "1"} -> {}.
    """
    out = dict(stored)
    for key in _COUNTERS:
        value = out.get(key)
        if key in out and (isinstance(value, bool) or not isinstance(value, int)):
            del out[key]
    by_metric = out.get("failuresByMetric")
    if by_metric is not None:
        kept = {}
        if isinstance(by_metric, Mapping):
            kept = {str(k): v for k, v in by_metric.items() if isinstance(v, int) and not isinstance(v, bool)}
        if kept:
            out["failuresByMetric"] = kept
        else:
            del out["failuresByMetric"]
    return out


@dataclass(frozen=True)
class Folded:
    """Counters after one more measurement, and what the release must do."""

    counters: dict[str, Any]
    decision: str
    reason: str = ""


def fold(
    counters: Mapping[str, Any] | None,
    m: Measurement,
    failure_limit: int,
    consecutive_error_limit: int,
    rfc3339: str,
) -> Folded:
    """Add one measurement to the counters of status.release.analysis and decide.

    Worked example, failureLimit 2, error-rate check 1%:
      check 1 (10:00:21): 4.2% -> failed 1, firstFailedAt 10:00:21, Continue
      check 2 (10:00:31): 3.9% -> failed 2 -> Rollback "error rate 3.9% > 1% in 2 of 2 checks; failed (2) >= failureLimit (2)"
    consecutiveErrorLimit 1: error, error -> consecutiveErrors 2 > 1 -> ErrorPause; a later answer resets it.
    """
    c: dict[str, Any] = {**empty_counters(), **dict(counters or {})}
    by_metric: dict[str, int] = dict(c.get("failuresByMetric") or {})
    c["checks"] += 1
    c["lastMeasuredAt"] = rfc3339
    c["lastVerdict"] = m.verdict
    c["lastMessage"] = m.message[:1000]
    if m.figures:
        c["figures"] = [f.to_status() for f in m.figures]
    if m.verdict == ERROR:
        c["errors"] += 1
        c["consecutiveErrors"] += 1
    else:
        c["consecutiveErrors"] = 0
    if m.verdict == INCONCLUSIVE:
        c["inconclusive"] += 1
    if m.verdict == SUCCESSFUL:
        c["successful"] += 1
        c["lastSuccessfulAt"] = rfc3339
    if m.verdict == FAILED:
        c["failed"] += 1
        c.setdefault("firstFailedAt", rfc3339)  # kept: the rollback's delay is measured from it
        for name in m.failed_metrics:
            by_metric[name] = by_metric.get(name, 0) + 1
    if by_metric:
        c["failuresByMetric"] = by_metric
    limit = max(1, failure_limit)
    if c["failed"] >= limit:
        measured = c["checks"] - c["errors"] - c["inconclusive"]
        worst = max(by_metric, key=lambda k: by_metric[k]) if by_metric else ""
        detail = m.message if m.verdict == FAILED else c.get("lastFailureMessage", "")
        reason = (
            f"{detail} in {by_metric.get(worst, c['failed'])} of {measured} checks; "
            f"failed ({c['failed']}) >= failureLimit ({failure_limit})"
        )
        if m.verdict == FAILED:
            c["lastFailureMessage"] = m.message[:1000]
        return Folded(c, ROLLBACK, reason)
    if m.verdict == FAILED:
        c["lastFailureMessage"] = m.message[:1000]
    if c["consecutiveErrors"] > consecutive_error_limit:
        reason = (
            f"{m.message}; errors ({c['consecutiveErrors']}) > consecutiveErrorLimit "
            f"({consecutive_error_limit}): release paused until the metrics provider answers"
        )
        return Folded(c, ERROR_PAUSE, reason)
    return Folded(c, CONTINUE)
