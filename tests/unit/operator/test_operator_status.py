"""Status: conditions (lastTransitionTime only on flips), phase, the single patch, and events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from chatfleet_operator.api import Reason
from chatfleet_operator.converge.diagnose import Problem
from chatfleet_operator.converge.facts import DeploymentFacts
from chatfleet_operator.converge.hold import first_progress, progress_hold, progress_only
from chatfleet_operator.converge.status import (
    Observation,
    compute_status,
    derive_phase,
    error_message,
    error_status,
    get_condition,
    merge_conditions,
    status_events,
    status_patch,
)
from chatfleet_operator.intents import EventIntent
from chatfleet_operator.settings import RetrySettings, Settings

NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)


def dep(available=1, desired=1, updated=1, replicas=1, revision="r1", gen=1, observed=1, deadline=False):
    """Deployment facts."""
    return DeploymentFacts(
        "bot", gen, observed, desired, replicas, available, available, updated, revision, deadline
    )


def obs(deployment=None, problems=(), revision="r1", generation=1, desired=1, pods=()):
    """Observation with sane defaults."""
    return Observation(
        generation=generation,
        revision=revision,
        desired_replicas=desired,
        gpus_per_replica=2,
        endpoint="http://bot.ns.svc.cluster.local:8080",
        selector="chatfleet.io/service=bot,chatfleet.io/track=stable",
        deployment=deployment,
        pods=pods,
        problems=problems,
    )


class TestMergeConditions:
    def test_transition_time_kept_unless_status_flips(self):
        old = [{"type": "Ready", "status": "False", "reason": "A", "message": "", "lastTransitionTime": "t0"}]
        same = merge_conditions(
            old, [{"type": "Ready", "status": "False", "reason": "B", "message": "x"}], NOW
        )
        flipped = merge_conditions(
            old, [{"type": "Ready", "status": "True", "reason": "B", "message": "x"}], NOW
        )
        assert same[0]["lastTransitionTime"] == "t0"
        assert flipped[0]["lastTransitionTime"] == "2026-11-21T10:00:00Z"


class TestComputeStatus:
    @pytest.mark.parametrize(
        ("observation", "ready", "reason", "phase"),
        [
            pytest.param(obs(None), "False", Reason.PROGRESSING, "Progressing", id="no-deployment-yet"),
            pytest.param(
                obs(dep(available=0)), "False", Reason.WAITING_FOR_PODS, "Progressing", id="pods-coming"
            ),
            pytest.param(obs(dep()), "True", Reason.READY, "Ready", id="ready"),
            pytest.param(
                obs(dep(revision="r0")), "False", Reason.ROLLING_OUT, "Progressing", id="new-revision"
            ),
            pytest.param(
                obs(dep(), problems=[Problem(Reason.NO_MATCHING_GPU_NODES, "no node")]),
                "False",
                Reason.NO_MATCHING_GPU_NODES,
                "Failed",
                id="stalled",
            ),
        ],
    )
    def test_ready_reason_phase(self, observation, ready, reason, phase):
        status = compute_status({}, observation, NOW)
        cond = get_condition(status, "Ready")
        assert (cond["status"], cond["reason"], status["phase"]) == (ready, reason, phase)
        assert cond["observedGeneration"] == 1 and status["observedGeneration"] == 1

    def test_unchanged_facts_make_an_empty_patch(self):
        first = compute_status({}, obs(dep()), NOW)
        second = compute_status(first, obs(dep()), LATER)
        assert status_patch(first, second) == {}

    def test_gpus_and_endpoint(self):
        status = compute_status({}, obs(dep(replicas=3, available=3, desired=3, updated=3), desired=3), NOW)
        assert status["gpus"] == 6 and status["endpoint"].startswith("http://bot.ns.svc")
        assert status["stableRevision"] == "r1"

    def test_stable_revision_kept_while_rolling(self):
        old = compute_status({}, obs(dep()), NOW)
        new = compute_status(old, obs(dep(revision="r1"), revision="r2", generation=2), LATER)
        assert new["stableRevision"] == "r1" and new["updateRevision"] == "r2"


class TestDerivePhase:
    @pytest.mark.parametrize(
        ("conditions", "phase"),
        [
            pytest.param([], "Pending", id="nothing"),
            pytest.param([("Stalled", "True"), ("Ready", "True")], "Failed", id="stalled-wins"),
            pytest.param([("Degraded", "True")], "Degraded", id="degraded"),
            pytest.param([("Ready", "True")], "Ready", id="ready"),
            pytest.param([("Reconciling", "True")], "Progressing", id="reconciling"),
        ],
    )
    def test_phase(self, conditions, phase):
        status = {"conditions": [{"type": t, "status": s} for t, s in conditions]}
        assert derive_phase(status) == phase


class TestStatusEvents:
    def test_warning_once_per_distinct_problem(self):
        stalled = compute_status({}, obs(dep(), problems=[Problem(Reason.SECRET_NOT_FOUND, "m")]), NOW)
        assert [(e.type, e.reason) for e in status_events({}, stalled)] == [
            ("Warning", Reason.SECRET_NOT_FOUND)
        ]
        again = compute_status(stalled, obs(dep(), problems=[Problem(Reason.SECRET_NOT_FOUND, "m")]), LATER)
        assert status_events(stalled, again) == []
        other = compute_status(stalled, obs(dep(), problems=[Problem(Reason.INSUFFICIENT_GPUS, "m")]), LATER)
        assert [e.reason for e in status_events(stalled, other)] == [Reason.INSUFFICIENT_GPUS]

    def test_no_event_when_all_is_well(self):
        ready = compute_status({}, obs(dep()), NOW)
        assert status_events({}, ready) == []


def test_status_patch_nulls_keys_removed_from_nested_objects():
    """A merge patch merges nested objects, so a key dropped from status.release must be sent as null."""
    old = {"release": {"a": 1, "b": 2, "analysis": {"failed": 1}}, "gone": 1, "same": [1]}
    new = {"release": {"a": 1, "analysis": {"failed": 2}}, "same": [1]}
    assert status_patch(old, new) == {"release": {"b": None, "analysis": {"failed": 2}}, "gone": None}
    assert status_patch(new, new) == {}


class TestErrorStatus:
    """A pass that raised: Ready=False and Stalled=True with ReconcileError, one Warning, generation kept."""

    READY = compute_status({}, obs(dep()), NOW) | {"release": {"phase": "Progressing", "currentStepIndex": 1}}

    def test_conditions_name_the_error(self):
        new = error_status(self.READY, 2, "Overflow: [<class 'decimal.Overflow'>]", LATER)
        ready, stalled = get_condition(new, "Ready"), get_condition(new, "Stalled")
        assert (ready["status"], ready["reason"]) == ("False", Reason.RECONCILE_ERROR)
        assert (stalled["status"], stalled["reason"]) == ("True", Reason.RECONCILE_ERROR)
        assert stalled["message"] == ready["message"]
        assert "Overflow: [<class 'decimal.Overflow'>]" in stalled["message"]
        assert new["phase"] == "Failed"

    def test_observed_generation_is_not_advanced(self):
        new = error_status(self.READY, 2, "boom", LATER)
        assert new["observedGeneration"] == 1
        assert "observedGeneration" not in error_status({}, 1, "boom", LATER)

    def test_facts_are_kept(self):
        new = error_status(self.READY, 2, "boom", LATER)
        assert new["release"] == self.READY["release"] and new["replicas"] == self.READY["replicas"]

    def test_one_warning_then_no_write_while_the_error_repeats(self):
        first = error_status(self.READY, 2, "boom", LATER)
        again = error_status(first, 2, "boom", LATER + timedelta(minutes=1))
        assert status_events(self.READY, first) == [
            EventIntent("Warning", Reason.RECONCILE_ERROR, first_msg(first))
        ]
        assert status_patch(first, again) == {} and status_events(first, again) == []

    def test_a_good_pass_clears_it(self):
        failed = error_status(self.READY, 1, "boom", LATER)
        healed = compute_status(failed, obs(dep()), LATER)
        assert get_condition(healed, "Stalled")["status"] == "False"
        assert get_condition(healed, "Ready")["status"] == "True"

    @pytest.mark.parametrize(
        ("error", "message"),
        [
            pytest.param(ValueError("bad\nsecond line"), "ValueError: bad", id="first-line"),
            pytest.param(RuntimeError(), "RuntimeError", id="no-text"),
            pytest.param(KeyError("x"), "KeyError: 'x'", id="key-error"),
        ],
    )
    def test_error_message(self, error, message):
        assert error_message(error) == message


def first_msg(status):
    """The Stalled condition's message."""
    return get_condition(status, "Stalled")["message"]


class TestProgressOnly:
    """Which status changes are only progress on the way to Ready (written at most every few seconds)."""

    FRESH = dep(available=0, updated=0, replicas=0, observed=0)
    WAITING = dep(available=0, updated=1, replicas=1)

    def status(self, deployment, **kw):
        return compute_status({}, obs(deployment, **kw), NOW)

    def test_counts_and_a_progress_reason_are_progress(self):
        before, after = self.status(self.FRESH), self.status(self.WAITING)
        assert get_condition(before, "Ready")["reason"] == Reason.ROLLING_OUT
        assert get_condition(after, "Ready")["reason"] == Reason.WAITING_FOR_PODS
        assert progress_only(before, after)

    @pytest.mark.parametrize(
        "after",
        [
            pytest.param({"deployment": dep()}, id="ready-flips"),
            pytest.param({"deployment": WAITING, "generation": 2}, id="new-generation"),
            pytest.param(
                {"deployment": WAITING, "problems": [Problem(Reason.SECRET_NOT_FOUND, "no Secret r")]},
                id="a-problem",
            ),
            pytest.param({"deployment": WAITING, "revision": "r2"}, id="another-revision"),
        ],
    )
    def test_anything_else_is_not(self, after):
        before = self.status(self.FRESH)
        assert not progress_only(before, self.status(**after))

    def test_the_first_status_is_not(self):
        assert not progress_only({}, self.status(self.WAITING))


#: A ChatbotService no operator has written: what the API server hands over (the CRD's status default).
CRD_DEFAULT = {"observedGeneration": 0, "phase": "Pending"}


class TestFirstProgress:
    """A new ChatbotService's first status may wait while it says only that the first rollout is on its way."""

    WAITING = dep(available=0, updated=1, replicas=1)

    def status(self, deployment=WAITING, **kw):
        return compute_status({}, obs(deployment, **kw), NOW)

    @pytest.mark.parametrize("old", [{}, CRD_DEFAULT], ids=["no-status", "the-crd-default"])
    def test_the_first_rollout_on_its_way_is_first_progress(self, old):
        assert first_progress(old, self.status())
        assert first_progress(old, self.status(None))  # the Deployment not seen yet

    @pytest.mark.parametrize(
        "new",
        [
            pytest.param({"deployment": dep()}, id="ready"),
            pytest.param({"problems": [Problem(Reason.UNSCHEDULABLE, "no GPU")]}, id="a-problem"),
        ],
    )
    def test_ready_or_a_problem_is_not(self, new):
        assert not first_progress(CRD_DEFAULT, self.status(**new))

    def test_a_status_after_the_first_is_not(self):
        assert not first_progress(self.status(dep(available=0, updated=0)), self.status())

    def test_another_condition_is_not(self):
        status = self.status()
        status["conditions"].append(
            {"type": "ScalingActive", "status": "False", "reason": "AutoscalerPending"}
        )
        assert not first_progress(CRD_DEFAULT, status)


class TestProgressHold:
    """How long a status write waits: the first status from the Deployment's creation, progress from the last
    status write."""

    def hold(self, old, new, written_ago=None, started_ago=None, first=120.0, interval=5.0):
        settings = Settings(retry=RetrySettings(first_status_seconds=first, progress_status_seconds=interval))
        ago = lambda s: None if s is None else NOW - timedelta(seconds=s)  # noqa: E731
        return progress_hold(old, new, ago(written_ago), NOW, settings, ago(started_ago))

    FIRST = compute_status({}, obs(dep(available=0, updated=0, replicas=0, observed=0)), NOW)

    def test_the_first_status_waits_from_the_deployments_creation(self):
        assert self.hold(CRD_DEFAULT, self.FIRST, started_ago=30) == pytest.approx(90.0)
        assert self.hold(CRD_DEFAULT, self.FIRST, started_ago=121) == 0.0

    def test_the_first_status_is_written_at_once_without_a_deployment_or_a_wait(self):
        assert self.hold(CRD_DEFAULT, self.FIRST) == 0.0
        assert self.hold(CRD_DEFAULT, self.FIRST, started_ago=30, first=0) == 0.0

    def test_ready_first_is_written_at_once(self):
        ready = compute_status({}, obs(dep()), NOW)
        assert self.hold(CRD_DEFAULT, ready, started_ago=30) == 0.0

    def test_progress_waits_from_the_last_write(self):
        later = compute_status(self.FIRST, obs(dep(available=0, updated=1, replicas=1)), NOW)
        assert self.hold(self.FIRST, later, written_ago=2, started_ago=30) == pytest.approx(3.0)
