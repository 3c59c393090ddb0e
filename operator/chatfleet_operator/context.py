"""What one pass knows, gathered once before anything is planned (argo-rollouts' rolloutContext). Pure.

reconcile.py gathers it at the start of a pass: the object (ref, typed spec, old status), the snapshot of
its children, pods and nodes, the clock, the settings, and what follows from them -- the revision the
spec asks for, the total replicas, the observed tracks, the traffic mode the cluster offers, whether a
route carries it and the Gateway's word on that route, the release part of the status parsed once, and
(once taken) this pass's analysis measurement. The planner, the strategies, the children's builders and the
status take it (or the parts they need) instead of threading a dozen arguments; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chatfleet_operator.analysis.assess import Measurement
from chatfleet_operator.converge.facts import NodeFacts, PodFacts, Track
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import Autoscale, ChatbotServiceSpec, ObjectRef

if TYPE_CHECKING:  # types only: the release reads the context (imports run release -> context)
    from chatfleet_operator.release.route import RouteState
    from chatfleet_operator.release.state import ReleaseStatus


@dataclass(frozen=True)
class DialogueCheck:
    """How many requests the old revision served in the last idleSeconds, while it drains pinned dialogues."""

    requests: float | None
    """The figure (0: its dialogues have ended); None when it could not be measured."""
    error: str = ""
    """Why it could not be measured (Prometheus unreachable, a refused address)."""


@dataclass(frozen=True)
class PassContext:
    """One pass over one ChatbotService: what it observed and what follows from it, gathered once."""

    ref: ObjectRef
    spec: ChatbotServiceSpec
    old_status: Mapping[str, Any]
    children: Mapping[tuple[str, str], Mapping[str, Any]]
    """Owned objects by (kind, name), as observed when the pass began."""
    pods: Sequence[PodFacts]
    nodes: Sequence[NodeFacts]
    now: datetime
    settings: Settings
    update_revision: str
    """The revision the spec asks for (revision_hash of the spec)."""
    total: int
    """Desired replicas over all tracks (spec.scaling.replicas, or the autoscaler's decision)."""
    traffic: str
    """How a canary splits traffic in this cluster: HTTPRoute or ReplicaRatio (release/traffic.py)."""
    stable: Track
    """The stable Deployment as observed."""
    canary: Track
    """The Deployment of the new revision as observed (its track is the strategy's: canary, preview)."""
    release_status: ReleaseStatus
    """The release part of old_status, parsed once (the release, its history, the stable revision); the
    planner works on a copy of it."""
    backends: str = "Service"
    """What the HTTPRoute's backends are: Service, or InferencePool where the cluster serves the Gateway
    API Inference Extension (release/traffic.py, builders/inferencepool.py)."""
    routed: bool = False
    """Whether an HTTPRoute carries this pass's traffic: the strategy's answer for the traffic mode."""
    route: RouteState | None = None
    """The parent Gateway's word on the HTTPRoute as observed when the pass began (condition RouteServed);
    None where no route carries the traffic (release/route.py observed_route)."""
    measurement: Measurement | None = None
    """This pass's analysis measurement, when one was due (release/measure.py takes it)."""
    dialogue_check: DialogueCheck | None = None
    """While the old revision drains its pinned dialogues: this pass's check of them, when one was due."""
    metrics_source: str = ""
    """Which autoscaler scales the ChatbotService: KEDA or HPA (discovery, autoscale/measure.py); '' if none."""
    forecast: Mapping[str, Any] | None = None
    """status.autoscaling.forecast of this pass (autoscale/measure.py), when forecasting."""
    floor: int | None = None
    """The autoscaler's minimum from the forecast and the SLO (None: minReplicas)."""
    forecast_in: float | None = None
    """Seconds until the forecast or the SLO check is due again (the pass requeues then)."""
    slo: Mapping[str, Any] | None = None
    """status.autoscaling.slo of this pass (autoscale/slo.py), with spec.scaling.autoscale.slo."""
    model_load: Mapping[str, Any] | None = None
    """status.autoscaling.modelLoadSeconds of this pass."""

    def observed(self, kind: str, name: str) -> Mapping[str, Any] | None:
        """An owned object as observed (None when it does not exist)."""
        return self.children.get((kind, name))


def route_settle_seconds(ctx: PassContext) -> float:
    """How long a canary's pods outlive the route change that moves traffic off them: the operator's
    setting behind an HTTPRoute, 0 where no route carries the split (replica ratio, blue-green's Services)."""
    return ctx.settings.release.route_settle_seconds if ctx.routed else 0.0


def route_join_seconds(ctx: PassContext) -> float:
    """How long a canary pod has been Ready before a route sends it users: the operator's setting behind
    an HTTPRoute, 0 where no route carries the split."""
    return ctx.settings.release.route_join_seconds if ctx.routed else 0.0


def autoscaled_total(
    autoscale: Autoscale,
    declared: int | None,
    old_status: Mapping[str, Any],
    stable: Mapping[str, Any] | None,
) -> int:
    """Replicas of an autoscaled ChatbotService: the HPA's decision, clamped to minReplicas..maxReplicas.

    The HPA scales the ChatbotService, so its decision is spec.scaling.replicas. Until it is there (a
    new object, or one from before the HPA scaled the ChatbotService), the last total in
    status.desiredReplicas, else the stable Deployment's replicas, else minReplicas. Never the stable
    Deployment during a release: the release itself shrinks it.
    e.g. min 1, max 6: replicas 4 -> 4; replicas 9 -> 6; absent with status.desiredReplicas 3 -> 3.
    """
    decided = (declared, old_status.get("desiredReplicas"))
    current = (stable or {}).get("spec", {})
    value = next((v for v in (*decided, current.get("replicas")) if v is not None), autoscale.min_replicas)
    return max(autoscale.min_replicas, min(autoscale.max_replicas, int(value)))


def desired_total(
    spec: ChatbotServiceSpec, old_status: Mapping[str, Any], stable: Mapping[str, Any] | None
) -> int:
    """Replicas over all tracks: spec.scaling.replicas, or the autoscaler's decision (autoscaled_total)."""
    autoscale = spec.scaling.autoscale
    if autoscale is None:
        return spec.scaling.replicas
    declared = spec.scaling.replicas if spec.scaling.replicas_set else None
    return autoscaled_total(autoscale, declared, old_status, stable)
