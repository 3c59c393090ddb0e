"""A tick-by-tick world for the pure release planner: an injected clock, tracks that follow the plan.

Each `tick(seconds, ...)` advances the clock, hands the planner what a pass would observe (tracks, the
measurement of this pass when one is due) and applies the plan the way the cluster would: Deployments
take the replica counts, pods get Ready unless the scenario says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from chatfleet_operator.analysis.assess import Check, Measurement, Sample, assess
from chatfleet_operator.context import DialogueCheck, PassContext
from chatfleet_operator.converge.facts import PodFacts, Track
from chatfleet_operator.release.planner import analysis_due, dialogue_check_due, plan_release, strategy_of
from chatfleet_operator.release.route import RouteState
from chatfleet_operator.release.state import ReleaseStatus
from chatfleet_operator.release.strategy import ReleasePlan
from chatfleet_operator.release.traffic import REPLICA_RATIO
from chatfleet_operator.settings import ReleaseSettings, Settings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
CHECKS = (Check("error rate", "%", max_value=1.0), Check("P99 latency", "ms", max_value=500.0))


def release_context(
    spec: ChatbotServiceSpec,
    update_revision: str,
    total: int,
    stable: Track,
    canary: Track,
    traffic: str,
    now: datetime,
    old: ReleaseStatus,
    measurement: Measurement | None = None,
    dialogue_check: DialogueCheck | None = None,
    route_settle: float = 0.0,
    route: RouteState | None = None,
    route_join: float = 0.0,
) -> PassContext:
    """The context of one pass as the planner reads it: the tracks, the clock, the release status, this
    pass's measurements; whether a route carries the traffic is the strategy's answer, as in a real pass."""
    return PassContext(
        ref=ObjectRef("shop", "bot", "uid-1"),
        spec=spec,
        old_status={},
        children={},
        pods=(*stable.pods, *canary.pods),
        nodes=(),
        now=now,
        settings=Settings(
            release=ReleaseSettings(route_settle_seconds=route_settle, route_join_seconds=route_join)
        ),
        update_revision=update_revision,
        total=total,
        traffic=traffic,
        stable=stable,
        canary=canary,
        routed=strategy_of(spec).routes(traffic),
        route=route,
        release_status=old,
        measurement=measurement,
        dialogue_check=dialogue_check,
    )


def spec_dict(**rollout: Any) -> dict[str, Any]:
    """A spec with short steps and a 10 s analysis interval; rollout fields as keywords."""
    strategy = rollout.pop("strategy", "canary")
    steps = rollout.pop(
        "steps",
        [
            {"weight": 20, "pauseSeconds": 10},
            {"weight": 50, "pauseSeconds": 10},
            {"weight": 100, "pauseSeconds": 0},
        ],
    )
    analysis = {
        "intervalSeconds": 10,
        "failureLimit": 2,
        "consecutiveErrorLimit": 2,
        "progressDeadlineSeconds": 30,
    }
    analysis.update(rollout.pop("analysis", {}))
    r: dict[str, Any] = {"strategy": strategy, **rollout}
    if strategy == "canary":
        r["canary"] = {"steps": steps}
    return {"model": {"uri": "hf://org/m"}, "rollout": r, "analysis": analysis}


@dataclass
class World:
    """Stable on revision A with `total` replicas; the spec asks for `update`."""

    spec: dict[str, Any] = field(default_factory=spec_dict)
    total: int = 2
    update: str = "B"
    traffic: str = REPLICA_RATIO
    now: datetime = T0
    status: dict[str, Any] = field(default_factory=lambda: {"stableRevision": "A"})
    stable: Track = field(default_factory=lambda: Track("A", 2, 2, exists=True))
    canary: Track = field(default_factory=Track)
    # scenario knobs
    canary_health: str = "ok"  # ok | unready | crashloop | nogpu
    error_rate: float | None = 0.1  # canary figures the fake Prometheus returns; None: no traffic
    latency: float = 100.0
    prometheus_up: bool = True
    route_settle: float = 0.0  # the operator's route_settle_seconds (HTTPRoute canary only)
    route_join: float = 0.0  # its route_join_seconds (0 here: a pod joins the route the tick it is Ready)
    stable_requests: float = 0.0  # requests the stable track served in the idle window (dialogue drain)
    route: RouteState | None = None  # the parent Gateway's word on the HTTPRoute (None: no route read)
    measured: int = 0
    dialogue_checks: int = 0
    plans: list[ReleasePlan] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stable = Track("A", self.total, self.total, exists=True)

    def sample(self) -> Sample:
        """What the fake Prometheus answers now."""
        if not self.prometheus_up:
            return Sample(self.now, error="Prometheus at http://prom did not answer: connection refused")
        if self.error_rate is None:
            return Sample(self.now, 0.0)
        return Sample(
            self.now,
            5.0,
            {"error rate": self.error_rate, "P99 latency": self.latency},
            {"error rate": 0.1, "P99 latency": 100.0},
        )

    def tick(self, seconds: float = 1.0) -> ReleasePlan:
        """Advance the clock, run one pass, apply its plan."""
        self.now += timedelta(seconds=seconds)
        spec = ChatbotServiceSpec.from_dict(self.spec)
        measurement = None
        old = ReleaseStatus.from_status(self.status)
        if analysis_due(spec, old.release, self.canary, self.now):
            self.measured += 1
            measurement = assess(self.sample(), CHECKS)
        check = None
        if dialogue_check_due(spec, old.release, self.now):
            self.dialogue_checks += 1
            check = (
                DialogueCheck(self.stable_requests)
                if self.prometheus_up
                else DialogueCheck(None, "Prometheus at http://prom did not answer: connection refused")
            )
        ctx = release_context(
            spec,
            self.update,
            self.total,
            self.stable,
            self.canary,
            self.traffic,
            self.now,
            old,
            measurement,
            check,
            self.route_settle,
            self.route,
            self.route_join,
        )
        plan = plan_release(ctx)
        self.plans.append(plan)
        self._apply(plan)
        return plan

    def _apply(self, plan: ReleasePlan) -> None:
        """The cluster's side: Deployments follow the plan; pods are Ready per the scenario."""
        stable_rev = self.update if plan.stable_from_spec else self.stable.revision
        self.stable = Track(stable_rev, plan.stable_replicas, plan.stable_replicas, exists=True)
        n = plan.canary_replicas
        rev = self.update
        pods: tuple[PodFacts, ...] = ()
        ready = n
        if self.canary_health == "unready":
            ready = 0
            pods = tuple(PodFacts(f"c-{i}", rev, "canary", "Running", False) for i in range(n))
        elif self.canary_health == "crashloop":
            ready = 0
            pods = tuple(
                PodFacts(
                    f"c-{i}", rev, "canary", "Running", False, waiting_reason="CrashLoopBackOff", restarts=3
                )
                for i in range(n)
            )
        elif self.canary_health == "nogpu":
            ready = 0
            msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
            pods = tuple(
                PodFacts(f"c-{i}", rev, "canary", "Pending", False, unschedulable_message=msg)
                for i in range(n)
            )
        self.canary = Track(rev, n, ready, pods, exists=n > 0 or self.canary.exists)
        status = {
            k: v
            for k, v in self.status.items()
            if k not in ("release", "canaryRevision", "currentStepIndex", "pauseStartTime")
        }
        status.update(plan.status_fields(self.update).fields)
        if plan.promoted:
            status["stableRevision"] = plan.promoted
        status["releaseHistory"] = [h.to_status() for h in plan.history]
        self.status = status

    def run_until(self, predicate, max_ticks: int = 300, seconds: float = 1.0) -> int:
        """Tick until predicate(self); the number of ticks taken (asserts it happened)."""
        for n in range(1, max_ticks + 1):
            self.tick(seconds)
            if predicate(self):
                return n
        raise AssertionError(f"never happened; status: {self.status}")

    @property
    def phase(self) -> str:
        """status.release.phase ('' when no release)."""
        return (self.status.get("release") or {}).get("phase", "")

    @property
    def gate(self) -> str:
        """Reason of the last plan's gate."""
        g = self.plans[-1].gate if self.plans else None
        return g.reason if g else ""

    def set_rollout(self, **fields: Any) -> None:
        """Edit spec.rollout (a GitOps commit or a plugin patch)."""
        self.spec = {**self.spec, "rollout": {**self.spec["rollout"], **fields}}


def world(**kw: Any) -> World:
    """A World whose spec has the rollout fields in `rollout=` and everything else as attributes."""
    rollout = kw.pop("rollout", {})
    return World(spec=spec_dict(**rollout), **kw)
