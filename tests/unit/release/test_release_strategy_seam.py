"""What differs per strategy is asked of the strategy (release/strategy.py's protocol), never decided by
comparing spec.rollout.strategy values elsewhere: its status fields, whether a release starts shadowing,
whether its traffic runs through an HTTPRoute, and the steps `kubectl chatbot status` shows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from chatfleet_operator.converge.facts import PodFacts, Track
from chatfleet_operator.release.planner import STRATEGIES, plan_release, stepped
from chatfleet_operator.release.state import ReleaseStatus
from chatfleet_operator.release.traffic import HTTPROUTE, REPLICA_RATIO
from chatfleet_operator.spec import ChatbotServiceSpec, Strategy
from release_sim import release_context

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def spec_of(strategy: str, shadow: bool = False) -> ChatbotServiceSpec:
    d = {"model": {"uri": "hf://org/m"}, "scaling": {"replicas": 2}, "rollout": {"strategy": strategy}}
    if shadow:
        d["analysis"] = {"quality": {"shadow": {"enabled": True}}}
    return ChatbotServiceSpec.from_dict(d)


def first_plan(spec: ChatbotServiceSpec, traffic: str = REPLICA_RATIO):
    pods = (PodFacts("bot-0", "r1", "stable", "Running", True),)
    stable = Track("r1", 2, 2, pods, exists=True)
    old = ReleaseStatus.from_status({"stableRevision": "r1"})
    return plan_release(release_context(spec, "r2", 2, stable, Track(), traffic, NOW, old))


def test_every_registered_strategy_answers_the_whole_protocol():
    for name, strategy in STRATEGIES.items():
        assert isinstance(strategy.stepped, bool), name
        assert strategy.track in ("canary", "preview"), name
        for method in ("starts_shadowing", "routes", "traffic_intent", "advance", "prepare"):
            assert callable(getattr(strategy, method)), (name, method)


@pytest.mark.parametrize(("strategy", "step_fields"), [(Strategy.CANARY, True), (Strategy.BLUE_GREEN, False)])
def test_the_plan_carries_its_strategys_status_fields(strategy, step_fields):
    plan = first_plan(spec_of(strategy))
    assert plan.in_release and plan.stepped is step_fields
    fields = plan.status_fields("r2").fields
    assert ("currentStepIndex" in fields) is step_fields
    assert fields["canaryRevision"] == "r2"


@pytest.mark.parametrize(
    ("strategy", "shadow", "phase"),
    [
        (Strategy.CANARY, True, "Shadowing"),
        (Strategy.CANARY, False, "Progressing"),
        (Strategy.BLUE_GREEN, True, "Progressing"),  # blue-green's preview is its trial: no shadow phase
    ],
)
def test_a_release_starts_shadowing_only_where_its_strategy_says(strategy, shadow, phase):
    assert first_plan(spec_of(strategy, shadow)).release.phase == phase


@pytest.mark.parametrize(
    ("strategy", "traffic", "routes"),
    [
        (Strategy.CANARY, HTTPROUTE, True),
        (Strategy.CANARY, REPLICA_RATIO, False),
        (Strategy.BLUE_GREEN, HTTPROUTE, False),
    ],
)
def test_only_a_strategy_that_says_so_runs_through_a_route(strategy, traffic, routes):
    assert STRATEGIES[strategy].routes(traffic) is routes


@pytest.mark.parametrize(
    ("name", "shown"), [("canary", True), ("blueGreen", False), ("someday", True), (None, True)]
)
def test_the_plugin_shows_steps_for_stepped_and_unknown_strategies(name, shown):
    assert stepped(name) is shown
