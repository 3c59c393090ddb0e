"""The children of one pass, each built once for its track from the release plan. Pure.

`plan_pass` plans the release from the pass's context; `desired_children` then builds every child once:
- the stable Deployment: from the spec (its Triton config in the pod template), or -- while a release
  runs or after a rollback -- its observed template kept (the old revision and its config) at the plan's
  replicas;
- the Deployment of the new revision (the strategy's track: canary, preview): from the spec; kept on its
  observed template at 0 replicas when idle;
- the traffic objects the strategy names (Services, the HTTPRoute), then the PDB (more than one pod
  possible), the HPA, and the stream relay's objects (spec.streamRelay, builders/relay.py).
Manifests are returned in the rollback order: traffic objects first, then the stable Deployment, then
the canary -- so traffic is on stable before the canary shrinks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.autoscale.forecast import scale_down_seconds
from chatfleet_operator.autoscale.warmpool import SurgePool, pool_size, surge_pool
from chatfleet_operator.builders import (
    build_deployment,
    build_hpa,
    build_pdb,
    build_scaledobject,
)
from chatfleet_operator.builders.common import deployment_name, with_desired_hash
from chatfleet_operator.builders.pdb import pdb_wanted
from chatfleet_operator.builders.relay import relay_objects, replicas_service_name
from chatfleet_operator.context import PassContext
from chatfleet_operator.converge.facts import PodFacts, deployment_facts
from chatfleet_operator.release import router
from chatfleet_operator.release.planner import (
    ReleasePlan,
    held_plan,
    plan_release,
    starts_release,
    strategy_of,
)
from chatfleet_operator.release.router import service_selector
from chatfleet_operator.release.strategy import selector_text
from chatfleet_operator.release.traffic import REPLACE_IN_PLACE, SURGE
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef


def plan_pass(ctx: PassContext, hold: bool = False) -> ReleasePlan:
    """The release plan of this pass (planner.plan_release over the pass's context);
    `hold`: a release it would start is held back (planner.held_plan; the upgrade wave has no place)."""
    plan = plan_release(ctx)
    return held_plan(ctx) if hold and starts_release(plan) else plan


@dataclass(frozen=True)
class TrackBuild:
    """How one Deployment of this pass is built: its track, revision, replicas and template source."""

    track: str
    revision: str
    replicas: int
    template: Mapping[str, Any] | None = None
    """The observed pod template to keep (with the config it carries); None: built from the spec."""


def _observed_template(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template of an observed Deployment."""
    return (body.get("spec") or {}).get("template") or None


def warm_pool(ctx: PassContext, plan: ReleasePlan) -> int:
    """Standby replicas the stable Deployment runs beside the serving ones (autoscale/warmpool.py).

    Given up while a release's new revision waits for GPUs (its pods cannot be scheduled, or the release
    replaces stable pods in place for lack of a spare GPU): the release goes first.
    e.g. warmPool 2, no release -> 2; a canary pod Pending "Insufficient nvidia.com/gpu" -> 0.
    """
    rel = plan.release
    waits = plan.in_release and (
        ctx.canary.waiting_for_gpus or (rel is not None and rel.capacity == REPLACE_IN_PLACE)
    )
    return pool_size(pool_wanted(ctx, plan.stable_replicas), waits)


def surge_of(ctx: PassContext, serving: int) -> SurgePool | None:
    """What spec.scaling.autoscale.surge asks of the pool with `serving` replicas (None without one)."""
    autoscale = ctx.spec.scaling.autoscale
    if autoscale is None or autoscale.surge is None:
        return None
    load = (ctx.model_load or {}).get("seconds")
    return surge_pool(autoscale.surge, serving, autoscale.max_replicas, load, autoscale.slo)


def pool_wanted(ctx: PassContext, serving: int) -> int:
    """Standbys asked for: warmPool.replicas, or more when the forecast's error (warmPool.fromForecastError:
    status.autoscaling.forecast.standbys, autoscale/forecast.py) or a declared surge (autoscale/warmpool.py)
    needs them; within maxReplicas beside the serving ones, never under warmPool.replicas."""
    surge = surge_of(ctx, serving)
    autoscale = ctx.spec.scaling.autoscale
    error = 0
    if autoscale is not None and autoscale.pool_from_forecast_error:
        wanted = int((ctx.forecast or {}).get("standbys") or 0)
        error = min(wanted, max(0, autoscale.max_replicas - serving))
    return max(ctx.spec.scaling.warm_pool, error, surge.standby if surge else 0)


def stable_build(ctx: PassContext, plan: ReleasePlan) -> TrackBuild:
    """The stable Deployment: the spec's revision, or its observed template (old revision) at a new size.

    Replicas are always set, autoscaled or not: the HPA scales the ChatbotService, not a Deployment. With
    a warm pool the Deployment runs the serving replicas plus the pool.
    """
    observed = ctx.observed("Deployment", deployment_name(ctx.ref))
    replicas = plan.stable_replicas + warm_pool(ctx, plan)
    if plan.stable_from_spec or observed is None:
        return TrackBuild(api.TRACK_STABLE, ctx.update_revision, replicas)
    revision = ctx.stable.revision or ctx.update_revision
    return TrackBuild(api.TRACK_STABLE, revision, replicas, _observed_template(observed))


def new_revision_build(ctx: PassContext, plan: ReleasePlan, track: str) -> TrackBuild | None:
    """The canary/preview Deployment: the spec's revision; kept on its observed template at 0 when idle."""
    if plan.canary_replicas > 0:
        return TrackBuild(track, ctx.update_revision, plan.canary_replicas)
    observed = ctx.observed("Deployment", deployment_name(ctx.ref, track))
    if observed is None:
        return None
    return TrackBuild(track, ctx.canary.revision or ctx.update_revision, 0, _observed_template(observed))


def serving_revision(ctx: PassContext, plan: ReleasePlan) -> str:
    """The revision the stable Deployment runs after this pass (status.currentRevision)."""
    return stable_build(ctx, plan).revision


def _track_deployment(ctx: PassContext, build: TrackBuild, in_place: bool) -> dict[str, Any]:
    """The Deployment of one track: from the spec, or on its observed template (its config included)."""
    ref, spec, pod = ctx.ref, ctx.spec, ctx.settings.pod
    common: dict[str, Any] = {
        "track": build.track,
        "revision": build.revision,
        "replicas": build.replicas,
        "in_place": in_place,
    }
    if spec.scaling.pooled and build.template is None:
        # stable pods join when the operator says; release pods always serve; an observed template keeps
        # its labels
        common["serving"] = "false" if build.track == api.TRACK_STABLE else "true"
    return build_deployment(ref, spec, pod, template=build.template, **common)


def desired_children(ctx: PassContext, plan: ReleasePlan) -> list[dict[str, Any]]:
    """Every child of this pass, each built once, in the rollback order (see the module docstring)."""
    ref, spec = ctx.ref, ctx.spec
    strategy = strategy_of(spec)
    in_place = template_update_in_place(
        spec.rollout.gpu_capacity, ctx.observed("Deployment", deployment_name(ref)), ctx.pods
    )
    stable = stable_build(ctx, plan)
    stable_dep = _track_deployment(ctx, stable, in_place)
    new = new_revision_build(ctx, plan, strategy.track)
    new_objs = [_track_deployment(ctx, new, in_place)] if new else []
    traffic = [
        serving_only(m) if spec.scaling.pooled else m
        for m in router.traffic_objects(ctx, strategy.traffic_intent(ctx, plan, stable.revision))
    ]
    rest = [build_pdb(ref)] if pdb_wanted(spec) else []
    rest += autoscaler_objects(ctx)
    rest += stream_relay(ctx, traffic)

    # Rollback order: traffic first (existing Services and routes), then stable grows back, then the
    # canary shrinks. Traffic objects that do not exist yet come last, as in the steady state: the API
    # server allocates ClusterIPs one at a time (about 30/s), and pods should not wait behind them.
    exists = [ctx.observed(m["kind"], m["metadata"]["name"]) is not None for m in traffic]
    desired = [m for m, e in zip(traffic, exists, strict=True) if e]
    desired.append(stable_dep)
    desired += new_objs
    desired += rest
    desired += [m for m, e in zip(traffic, exists, strict=True) if not e]
    return desired


def stream_relay(ctx: PassContext, traffic: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The stream relay's objects (builders/relay.py): through a Service selecting what Service `<name>`
    of this pass selects; the relay itself once that Service's ClusterIP is observed."""
    ref = ctx.ref
    main = next((m for m in traffic if m["kind"] == "Service" and m["metadata"]["name"] == ref.name), None)
    observed = ctx.observed("Service", replicas_service_name(ref)) or {}
    ip = str((observed.get("spec") or {}).get("clusterIP") or "")
    return relay_objects(ref, ctx.spec, main, ip)


def serving_only(manifest: dict[str, Any]) -> dict[str, Any]:
    """A Service narrowed to serving pods (chatfleet.io/serving=true): standby pods take no traffic."""
    if manifest.get("kind") != "Service":
        return manifest
    spec = dict(manifest["spec"])
    spec["selector"] = {**spec["selector"], api.LABEL_SERVING: "true"}
    return with_desired_hash({**manifest, "spec": spec})


def autoscaler_objects(ctx: PassContext) -> list[dict[str, Any]]:
    """The ScaledObject (the cluster serves KEDA) or the HPA, with the forecast floor as its minimum and the
    scale-down window forecast.scaleDown asks for."""
    autoscale = ctx.spec.scaling.autoscale
    if autoscale is None:
        return []
    window = scale_down_seconds(autoscale, ctx.forecast)
    if ctx.metrics_source == api.METRICS_KEDA:
        address = ctx.spec.analysis.prometheus_address
        return [build_scaledobject(ctx.ref, autoscale, address, ctx.floor, window)]
    return [build_hpa(ctx.ref, autoscale, ctx.settings.hpa_metrics, ctx.floor, window)]


def scale_selector(ref: ObjectRef, spec: ChatbotServiceSpec, plan: ReleasePlan) -> str:
    """status.selector, the pods the HPA averages over (scale subresource): those that take traffic.

    No release: the stable track. During a release the strategy says (release_selector): canary both
    tracks, blue-green the revision the active Service selects.
    e.g. "chatfleet.io/service=bot,chatfleet.io/track=stable"; canary "chatfleet.io/service=bot".
    """
    if not plan.in_release:
        selector = selector_text(service_selector(ref, **{api.LABEL_TRACK: api.TRACK_STABLE}))
    else:
        selector = strategy_of(spec).release_selector(ref, plan)
    if spec.scaling.pooled:  # the HPA averages over the pods that take traffic, not the pool
        selector += f",{api.LABEL_SERVING}=true"
    return selector


def template_update_in_place(
    gpu_capacity: str, observed: Mapping[str, Any] | None, pods: Sequence[PodFacts]
) -> bool:
    """Whether the stable Deployment rolls a template change in place (maxSurge 0 / maxUnavailable 1).

    Same policy as releases (spec.rollout.gpuCapacity): Surge never, ReplaceInPlace always, Auto once a
    stable pod cannot be scheduled for lack of nvidia.com/gpu -- and then until that rollout is done
    (the observed strategy is in place and the Deployment not rolled out), so it does not flip back to
    surge between two pods. e.g. Auto, a stable pod Pending "Insufficient nvidia.com/gpu" -> True.
    """
    if gpu_capacity in (SURGE, REPLACE_IN_PLACE):
        return gpu_capacity == REPLACE_IN_PLACE
    stable = [p for p in pods if p.track == api.TRACK_STABLE and not p.deleting]
    if any(api.GPU_RESOURCE in p.unschedulable_message for p in stable):
        return True
    if observed is None:
        return False
    strategy = ((observed.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    in_place_now = str(strategy.get("maxSurge")) == "0"
    return in_place_now and not deployment_facts(observed).rolled_out
