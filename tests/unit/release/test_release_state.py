"""release/state.py reads a hand-edited status without raising (status is user-editable).

Test design: each case is one malformed status.release / status.releaseHistory as a user could write it
through the status subresource (the CRD keeps both open: x-kubernetes-preserve-unknown-fields); the typed
state reads it back tolerantly (an unknown enum value kept raw, a field of the wrong type read as absent),
and a whole planner pass over it neither raises nor loses the well-formed part.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from chatfleet_operator.converge.facts import PodFacts, Track
from chatfleet_operator.release.planner import plan_release
from chatfleet_operator.release.state import (
    HistoryEntry,
    ReleasePhase,
    ReleaseState,
    ReleaseStatus,
    Result,
    enum_or_raw,
    int_or_none,
    last_verdict,
    mirror_fields,
)
from chatfleet_operator.release.traffic import REPLICA_RATIO
from chatfleet_operator.spec import ChatbotServiceSpec
from release_sim import release_context

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
RELEASE = {"revision": "r2", "phase": "Progressing", "stepIndex": 1, "analysis": {"checks": 2, "failed": 1}}


def test_unknown_history_result_is_kept_as_written():
    status = {"releaseHistory": [{"revision": "r1", "result": "Reverted", "at": "t", "message": "by hand"}]}
    (entry,) = ReleaseStatus.from_status(status).history
    assert entry.result == "Reverted" and not isinstance(entry.result, Result)
    assert entry.to_status() == status["releaseHistory"][0]  # written back unchanged


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        pytest.param([{"revision": "r1", "result": "Promoted"}], [("r1", Result.PROMOTED)], id="known"),
        pytest.param([{"revision": "r1"}], [("r1", "")], id="result-missing"),
        pytest.param([{"revision": "r1", "result": ["x"]}], [("r1", "['x']")], id="result-not-a-string"),
        pytest.param(
            ["junk", 3, {"revision": "r1", "result": "Cancelled"}], [("r1", Result.CANCELLED)], id="no-object"
        ),
        pytest.param({"revision": "r1"}, [], id="history-not-a-list"),
        pytest.param("junk", [], id="history-a-string"),
    ],
)
def test_history_reads_tolerantly(history, expected):
    entries = ReleaseStatus.from_status({"releaseHistory": history}).history
    assert [(h.revision, h.result) for h in entries] == expected


@pytest.mark.parametrize(
    ("release", "check"),
    [
        pytest.param({**RELEASE, "phase": "Exploded"}, lambda r: r is None, id="unknown-phase"),
        pytest.param({**RELEASE, "phase": ["Progressing"]}, lambda r: r is None, id="phase-unhashable"),
        pytest.param({**RELEASE, "revision": 7}, lambda r: r is None, id="revision-not-a-string"),
        pytest.param("junk", lambda r: r is None, id="release-not-an-object"),
        pytest.param({**RELEASE, "stepIndex": "two"}, lambda r: r.step_index == 0, id="step-not-a-number"),
        pytest.param({**RELEASE, "stepIndex": "3"}, lambda r: r.step_index == 3, id="step-a-numeric-string"),
        pytest.param({**RELEASE, "stepIndex": -4}, lambda r: r.step_index == 0, id="step-negative"),
        pytest.param({**RELEASE, "weight": "ten"}, lambda r: r.weight is None, id="weight-not-a-number"),
        pytest.param(
            {**RELEASE, "analysis": "junk"}, lambda r: r.analysis == {}, id="analysis-not-an-object"
        ),
        pytest.param(
            {**RELEASE, "analysis": {"checks": "x", "failed": 1, "failuresByMetric": {"e": "1", "l": 2}}},
            lambda r: r.analysis == {"failed": 1, "failuresByMetric": {"l": 2}},
            id="counters-not-numbers",
        ),
        pytest.param({**RELEASE, "startedAt": 5}, lambda r: r.started_at is None, id="time-not-a-string"),
        pytest.param(
            {**RELEASE, "waitingForGPUs": "yes"}, lambda r: r.waiting_for_gpus is None, id="flag-not-a-bool"
        ),
    ],
)
def test_release_reads_tolerantly(release, check):
    rel = ReleaseStatus.from_status({"release": release}).release
    assert check(rel), rel


def test_a_well_formed_release_round_trips():
    rel = ReleaseState.from_status(RELEASE)
    assert rel is not None and rel.phase == ReleasePhase.STEPPING
    assert rel.to_status().items() >= RELEASE.items()


@pytest.mark.parametrize(
    "status",
    [
        pytest.param({"release": {"analysis": "junk"}}, id="analysis-a-string"),
        pytest.param({"release": "junk"}, id="release-a-string"),
        pytest.param({"release": {"analysis": {"lastVerdict": 3}}}, id="verdict-not-a-string"),
    ],
)
def test_last_verdict_of_a_malformed_status_is_none(status):
    assert last_verdict(status) is None


def test_enum_and_int_helpers():
    assert (
        enum_or_raw(Result, "Promoted") is Result.PROMOTED and enum_or_raw(Result, "Reverted") == "Reverted"
    )
    assert [int_or_none(v) for v in (2, "3", "x", True, None, 1.5)] == [2, 3, None, None, None, None]


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(
            {"releaseHistory": [{"revision": "r0", "result": "Reverted"}]}, id="unknown-history-result"
        ),
        pytest.param(
            {
                "release": {
                    **RELEASE,
                    "stepIndex": "two",
                    "analysis": {"checks": "x", "consecutiveErrors": []},
                }
            },
            id="malformed-release",
        ),
        pytest.param({"release": {**RELEASE, "stepIndex": 99}}, id="step-past-the-last"),
    ],
)
def test_a_pass_over_a_hand_edited_status_does_not_raise(status):
    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}, "scaling": {"replicas": 2}})
    pods = (PodFacts("bot-0", "r1", "stable", "Running", True),)
    stable = Track("r1", 2, 2, pods, exists=True)
    old = ReleaseStatus.from_status({"stableRevision": "r1", **status})
    plan = plan_release(release_context(spec, "r2", 2, stable, Track(), REPLICA_RATIO, NOW, old))
    assert plan.in_release and plan.release is not None and plan.release.revision == "r2"
    fields = mirror_fields(plan.stepped, plan.release, plan.history, plan.canary_weight)
    for h in status.get("releaseHistory", []):
        assert HistoryEntry.from_status(h).to_status() in fields["releaseHistory"]
