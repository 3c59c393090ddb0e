"""The metric catalogue (analysis/catalogue.py): the built-in checks as data, and floors in the assessor.

Test design: the checks a spec gives are written out by hand (what the analysis compared before the
catalogue, field by field); a floor is shown failing a drop against stable; and a metric added to the
catalogue alone (a tokens/s floor, PromQL included) reaches a measurement and fails it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from chatfleet_operator.analysis import catalogue
from chatfleet_operator.analysis.assess import FAILED, SUCCESSFUL, Check, Sample, assess
from chatfleet_operator.analysis.catalogue import FLOOR, Metric, metric_queries
from chatfleet_operator.analysis.provider import measurement_request
from chatfleet_operator.analysis.queries import Target
from chatfleet_operator.spec import ChatbotServiceSpec

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def analysis_of(d: dict):
    return ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}, "analysis": d}).analysis


def test_the_built_in_checks_of_a_spec():
    analysis = analysis_of(
        {
            "thresholds": {
                "errorRatePercent": 2,
                "latencyP99Milliseconds": 800,
                "timeToFirstTokenP99Milliseconds": 300,
            },
            "relative": {"errorRateIncreasePercent": 0.5, "latencyP99Ratio": 1.5},
            "customQueries": [{"name": "queue", "query": "sum(q)", "unit": "s", "max": 2, "min": 0.1}],
        }
    )
    assert [q.check for q in metric_queries(analysis)] == [
        Check("error rate", "%", max_value=2.0, max_increase_over_stable=0.5, min_failed_requests=2),
        Check("P99 latency", "ms", max_value=800.0, max_ratio_to_stable=1.5),
        Check("P99 time to first token", "ms", max_value=300.0),
        Check("queue", "s", max_value=2.0, min_value=0.1),
    ]
    target = Target("ns", "bot", "canary")
    promql = [q.promql(target, 60) for q in metric_queries(analysis)]
    assert "chatfleet" in promql[0] and promql[3] == "sum(q)"


@pytest.mark.parametrize(
    ("canary", "stable", "verdict", "text"),
    [
        (30.0, 50.0, FAILED, "tokens/s 30 < 40"),  # dropped below 0.8x stable
        (45.0, 50.0, SUCCESSFUL, "tokens/s 45"),
        (12.0, None, SUCCESSFUL, "tokens/s 12"),  # no stable figure: the absolute floor (10) alone
        (8.0, None, FAILED, "tokens/s 8 < 10"),
    ],
)
def test_a_floor_fails_a_drop_against_stable(canary, stable, verdict, text):
    check = Check("tokens/s", "", min_value=10.0, min_ratio_to_stable=0.8)
    got = assess(Sample(NOW, 3.0, {"tokens/s": canary}, {"tokens/s": stable}), [check])
    assert got.verdict == verdict and got.message.startswith(text), got.message


def test_a_metric_added_to_the_catalogue_alone_reaches_the_measurement(monkeypatch):
    drop = Metric(
        "tokens/s",
        "",
        lambda t, w: f'sum(rate(tokens_total{{track="{t.track}"}}[{w}s]))',
        FLOOR,
        absolute=lambda a: None,
        relative=lambda a: 0.8,
    )
    monkeypatch.setattr(catalogue, "BUILT_IN", (*catalogue.BUILT_IN, drop))
    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}})
    request = measurement_request("ns", "bot", spec, "canary")
    added = request.metrics[-1]
    assert added.check == Check("tokens/s", "", min_ratio_to_stable=0.8)
    assert added.promql(Target("ns", "bot", "canary"), 60) == 'sum(rate(tokens_total{track="canary"}[60s]))'
    checks = [q.check for q in request.metrics]
    sample = Sample(NOW, 3.0, {"tokens/s": 20.0, "error rate": 0.0}, {"tokens/s": 50.0, "error rate": 0.0})
    assert assess(sample, checks).verdict == FAILED
    assert assess(replace(sample, canary={"tokens/s": 48.0, "error rate": 0.0}), checks).verdict == SUCCESSFUL
