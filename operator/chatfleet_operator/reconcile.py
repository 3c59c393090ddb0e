"""One reconcile pass over one ChatbotService, in numbered steps (blocking; runs in a worker thread).

Data flows one way: observe (watch caches, snapshotted on the event loop) -> plan (pure builders and
planner) -> apply (kube.py, in a worker thread) -> compute status (pure) -> one status write, skipped
when unchanged -> events from the old -> new status difference; the release's transitions of a pass
whose status was written are counted in metrics.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from chatfleet_operator import api, kinds, metrics
from chatfleet_operator.autoscale.measure import Autoscaling
from chatfleet_operator.autoscale.state import scaling_condition
from chatfleet_operator.autoscale.warmpool import SurgePool, plan_serving, pool_status, pool_waits
from chatfleet_operator.builders import deployment_name, endpoint, revision_fields, revision_hash
from chatfleet_operator.cache import Snapshot, World, resource_version, slim
from chatfleet_operator.context import PassContext, desired_total
from chatfleet_operator.converge.changes import diff_children
from chatfleet_operator.converge.diagnose import Problem, diagnose
from chatfleet_operator.converge.facts import deployment_facts, observe_track
from chatfleet_operator.converge.fallback import plan_fallback
from chatfleet_operator.converge.hold import progress_hold
from chatfleet_operator.converge.policy import host_path_problems
from chatfleet_operator.converge.status import (
    Observation,
    compute_status,
    error_message,
    error_status,
    pass_events,
    refused_status,
    status_patch,
)
from chatfleet_operator.defaults import effective_spec
from chatfleet_operator.release.children import (
    scale_selector,
    serving_revision,
    surge_of,
    warm_pool,
)
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.release.planner import strategy_of
from chatfleet_operator.release.route import observed_route, routing_status
from chatfleet_operator.release.state import ReleaseStatus
from chatfleet_operator.release.strategy import ReleasePlan, ReleaseReason
from chatfleet_operator.release.traffic import HTTPROUTE, SERVICE_BACKENDS
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef
from chatfleet_operator.timefmt import parse_time
from chatfleet_operator.wave import UpgradeWave, held_condition, plan_in_wave, report_to_wave
from chatfleet_operator.writes import (
    Client,
    annotate_pods,
    apply_change,
    label_pods,
    post_events,
    seed_replicas,
    write_status,
)

log = logging.getLogger("chatfleet")


@dataclass
class Outcome:
    """Result of one pass."""

    problems: list[Problem]
    writes: int
    status: dict[str, Any]
    retry: bool = False
    """An apply failed in a way worth retrying (5xx, 429, 409) even without a kopf retry."""
    requeue_after: float | None = None
    """Seconds until a release waits on time (a pause, the next measurement); None: no timed wait."""
    refused: bool = False
    """The spec was refused (converge/policy.py): nothing was built, and only a spec change or an operator
    restart with other settings can change that, so the pass is not retried."""
    upgrade_held: bool = False
    """An update from the operator (a new pod template of the same revision, a release of its new defaults)
    waits for a place in the upgrade wave (wave.py)."""
    wave_changed: bool = False
    """This fleet's update left the wave, began failing or stopped failing: the fleets waiting for a place
    pass again (to go, or to say the wave is halted)."""


def gather_context(
    body: Mapping[str, Any],
    snap: Snapshot,
    settings: Settings,
    now: datetime,
    traffic: str,
    metrics_source: str = "",
    backends: str = "Service",
) -> PassContext:
    """Step 0: what the pass knows, gathered once (the object, the snapshot, and what follows). Pure."""
    ref = ObjectRef.from_body(body)
    # the fields the spec leaves to the operator (image, Prometheus) filled in: built from and hashed
    effective = effective_spec(body.get("spec"), settings.runtime.defaults)
    spec = ChatbotServiceSpec.from_dict(effective)
    old_status = body.get("status") or {}
    children = dict(snap.children)  # the pass's own view: applies below update the snapshot, not this
    stable = children.get(("Deployment", deployment_name(ref)))
    strategy = strategy_of(spec)
    track = strategy.track
    ctx = PassContext(
        ref=ref,
        spec=spec,
        old_status=old_status,
        children=children,
        pods=tuple(snap.pods),
        nodes=snap.nodes,
        now=now,
        settings=settings,
        update_revision=revision_hash(effective),
        total=desired_total(spec, old_status, stable),
        traffic=traffic,
        backends=backends if traffic == HTTPROUTE else SERVICE_BACKENDS,
        stable=observe_track(stable, snap.pods, api.TRACK_STABLE),
        canary=observe_track(children.get(("Deployment", deployment_name(ref, track))), snap.pods, track),
        metrics_source=metrics_source if spec.scaling.autoscale is not None else "",
        routed=strategy.routes(traffic),
        release_status=ReleaseStatus.from_status(old_status),
    )
    return replace(ctx, route=observed_route(ctx, children.get(("HTTPRoute", ref.name))))


def reconcile_pass(
    client: Client,
    body: Mapping[str, Any],
    snap: Snapshot,
    world: World,
    settings: Settings,
    now: datetime,
    releases: Releases | None = None,
    autoscaling: Autoscaling | None = None,
    wave: UpgradeWave | None = None,
) -> Outcome:
    """One level-triggered pass over one ChatbotService (blocking; runs in a worker thread)."""
    # 0. Gather what the pass knows, once (traffic mode and autoscaler: discovery, cached).
    releases = releases or Releases()
    autoscaling = autoscaling or Autoscaling()
    wave = wave or UpgradeWave()
    ctx = gather_context(
        body, snap, settings, now, releases.traffic_mode(), autoscaling.metrics_source(), releases.backends()
    )
    ref, spec = ctx.ref, ctx.spec

    # 1. Refuse (pure) what the operator may not build for any author (a host path it does not allow):
    #    nothing is applied, the status says why, and the pass waits for the spec or the operator to change.
    refusal = host_path_problems(spec, settings.pod)
    if refusal:
        return _refuse(client, body, world, refusal, now)

    # 2. Observe what the caches cannot tell: the release's measurement, the model-load time, the demand
    #    forecast and the SLO when due (their floors raise the total at once). A missing Secret needs no
    #    read: the pods' own status tells (CreateContainerConfigError, diagnosed in step 5).
    ctx = releases.measure_if_due(ctx)
    ctx = autoscaling.slo_if_due(autoscaling.forecast_if_due(ctx))

    # 3. Plan (pure): the release, then every child built once for its track; diff with the observed ones;
    #    with a warm pool, which Ready stable pods serve. An update from the operator itself (a new stable
    #    pod template of the same revision, a release of its new defaults) needs a place in the upgrade
    #    wave; without one the stable Deployment keeps its observed template and no release starts.
    plan, desired, held = plan_in_wave(ctx, wave)
    changes = diff_children(desired, snap.children, kinds.DELETABLE, kinds.DELETABLE_COMPONENTS)
    pool = warm_pool(ctx, plan) if spec.scaling.pooled else 0
    labels = plan_serving(ctx.pods, plan.stable_replicas) if spec.scaling.pooled else []
    fallback = plan_fallback(ctx.pods, spec.fallback.annotation() if spec.fallback else None)

    # 4. Apply: pod labels first (a scale-down then removes standby pods, not serving ones), spec.fallback
    #    into the pods' annotations, then only the children that differ. An invalid object is a problem
    #    for the user, not a crash.
    refused = [r for r in [label_pods(client, ref, labels), annotate_pods(client, ref, fallback)] if r]
    refused += [r for change in changes if (r := apply_change(client, change, world, snap, ref.namespace))]
    seed = spec.scaling.autoscale is not None and not spec.scaling.replicas_set
    if seed:  # the HPA reads and writes spec.scaling.replicas (the scale subresource): it must exist
        refused += [r for r in [seed_replicas(client, ref, ctx.total)] if r]

    # 5. Compute the whole new status (pure) from the freshest view of the Deployment.
    dep_body = snap.children.get(("Deployment", ref.name))
    dep = deployment_facts(dep_body) if dep_body is not None else None
    stable_pods = [p for p in snap.pods if p.track == api.TRACK_STABLE]
    problems = diagnose(spec, ctx.nodes, stable_pods, dep)  # canary pods: the release judges them
    if spec.scaling.pooled:  # standby pods waiting for GPUs are no problem while enough serve
        problems = pool_waits(problems, stable_pods, plan.stable_replicas)
    problems += [Problem(api.Reason.APPLY_FAILED, msg) for msg, _ in refused]
    problems += [
        Problem(api.Reason.INVALID_ANALYSIS_TARGET, msg) for msg in releases.target_errors(ref, spec)
    ]
    wave_changed = report_to_wave(wave, ctx, plan, dep, problems, stable_pods)
    obs = Observation(
        generation=ref.generation,
        revision=serving_revision(ctx, plan),
        desired_replicas=ctx.total,
        gpus_per_replica=spec.resources.gpus_per_replica,
        endpoint=endpoint(ref, settings.runtime.cluster_domain),
        selector=scale_selector(ref, spec, plan),
        deployment=dep,
        pods=stable_pods,
        problems=problems,
        standby=pool,
        standby_pods=sum(1 for p in stable_pods if p.serving == "false" and not p.deleting),
        autoscaling=_autoscaling_status(ctx, pool, stable_pods, surge_of(ctx, plan.stable_replicas)),
        scaling_active=_scaling_active(ctx),
        route_served=_route_served(ctx, snap),
        routing=routing_status(ctx, snap.children),
        upgrade_held=held_condition(held, ref.generation) if held is not None else None,
        spec_fields=revision_fields(body.get("spec") or {}),
    )
    new_status = compute_status(ctx.old_status, obs, now, plan.status_fields(ctx.update_revision))

    # 6. One status write, only when something changed; then events from the difference. Progress alone
    #    (counts on the way to Ready) is written at most every progress_status_seconds; meanwhile the pass
    #    asks to run again when the wait is over, and the difference stays for the next one.
    #    A new ChatbotService's first status waits, from its Deployment's creation, for Ready or a problem
    #    (first_status_seconds): until then it reads as the CRD's default, Pending (kstatus: InProgress).
    patch = status_patch(ctx.old_status, new_status)
    last_write = world.status_written_at((ref.namespace, ref.name))
    started = parse_time((dep_body or {}).get("metadata", {}).get("creationTimestamp"))
    hold = progress_hold(ctx.old_status, new_status, last_write, now, settings, started) if patch else 0.0
    if hold:
        patch, new_status = {}, dict(ctx.old_status)
        world.hold_status((ref.namespace, ref.name), now + timedelta(seconds=hold))
    writes = len(changes) + int(seed) + len(fallback)
    written = write_status(client, world, ref, patch, now)
    if patch and written is not None:
        writes += 1
        ready = next(c for c in new_status["conditions"] if c["type"] == api.COND_READY)
        log.info(
            "Updated status of ChatbotService %s/%s: phase=%s ready=%s (%s)",
            ref.namespace,
            ref.name,
            new_status["phase"],
            ready["status"],
            ready["reason"],
        )
        count_release_transitions(plan)  # counted once written (a transition not written is planned again)
    post_events(client, body, ref, pass_events(ctx.old_status, new_status, plan.events), now)
    return Outcome(
        problems=problems,
        writes=writes,
        status=new_status,
        retry=any(t for _, t in refused),
        requeue_after=min((t for t in (plan.requeue_after, ctx.forecast_in, hold) if t), default=None),
        upgrade_held=held is not None,
        wave_changed=wave_changed,
    )


def _refuse(
    client: Client, body: Mapping[str, Any], world: World, problems: list[Problem], now: datetime
) -> Outcome:
    """A pass that builds nothing (a spec the operator refuses): one status write when it changed, and
    one Warning event when the refusal is new. No retry: only a new spec or operator settings change it."""
    ref = ObjectRef.from_body(body)
    old_status = body.get("status") or {}
    new_status = refused_status(old_status, ref.generation, problems, now)
    patch = status_patch(old_status, new_status)
    written = write_status(client, world, ref, patch, now)
    if patch and written is None:  # the object is gone
        return Outcome(problems=problems, writes=0, status=new_status, refused=True)
    if patch:
        log.info("Refused to build ChatbotService %s/%s: %s", ref.namespace, ref.name, problems[0].message)
    post_events(client, body, ref, pass_events(old_status, new_status), now)
    return Outcome(problems=problems, writes=int(bool(patch)), status=new_status, refused=True)


def count_release_transitions(plan: ReleasePlan) -> None:
    """Count the release's transitions of one pass from its events (started, promoted, rolled back), and
    a rollback's delay from the release's first failed measurement (status release.analysis.firstFailedAt)."""
    strategy, rel = str(plan.strategy), plan.release
    for event in plan.events:
        if event.reason == ReleaseReason.STARTED:
            metrics.release_started(strategy)
        elif event.reason == ReleaseReason.PROMOTED:
            metrics.release_promoted(strategy)
        elif event.reason == ReleaseReason.ROLLED_BACK:
            first_failed = parse_time(rel.analysis.get("firstFailedAt")) if rel is not None else None
            rolled_back = parse_time(rel.rolled_back_at) if rel is not None else None
            metrics.release_rolled_back(strategy, first_failed, rolled_back)


def _autoscaling_status(
    ctx: PassContext, pool: int, stable_pods: list[Any], surge: SurgePool | None
) -> dict[str, Any] | None:
    """status.autoscaling of this pass (None without spec.scaling.autoscale)."""
    spec = ctx.spec
    if spec.scaling.autoscale is None:
        return None
    out: dict[str, Any] = {"metricsSource": ctx.metrics_source}
    if ctx.forecast is not None:
        out["forecast"] = dict(ctx.forecast)
    if spec.scaling.pooled:
        out["warmPool"] = pool_status(stable_pods, pool, spec.resources.gpus_per_replica)
    if ctx.model_load is not None:
        out["modelLoadSeconds"] = dict(ctx.model_load)
    if ctx.slo is not None:
        out["slo"] = dict(ctx.slo)
    if surge is not None:
        out["surge"] = {"standby": surge.standby, "reason": surge.reason}
    return out


def _scaling_active(ctx: PassContext) -> dict[str, Any] | None:
    """The ScalingActive condition from the observed HPA or ScaledObject (None without autoscale)."""
    if ctx.spec.scaling.autoscale is None:
        return None
    name = deployment_name(ctx.ref)
    if ctx.metrics_source == api.METRICS_KEDA:
        keda_hpa = ctx.observed("HorizontalPodAutoscaler", f"keda-hpa-{name}")
        return scaling_condition(
            ctx.metrics_source, ctx.observed("ScaledObject", name), keda_hpa, ctx.ref.generation
        )
    hpa = ctx.observed("HorizontalPodAutoscaler", name)
    return scaling_condition(ctx.metrics_source, hpa, None, ctx.ref.generation)


def _route_served(ctx: PassContext, snap: Snapshot) -> dict[str, Any] | None:
    """The RouteServed condition from the freshest view of the HTTPRoute (None where the pass writes none)."""
    route = observed_route(ctx, snap.children.get(("HTTPRoute", ctx.ref.name)))
    return route.condition(ctx.ref.generation) if route is not None else None


class PassFailed(Exception):
    """A pass raised; its error is already in the status (ReconcileError) and in one Warning event."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error_message(error))
        self.error = error


def record_error(
    client: Client, body: Mapping[str, Any], world: World, error: BaseException, now: datetime
) -> None:
    """After a pass raised: write Ready=False/Stalled=True (ReconcileError) once, and one Warning event."""
    ref = ObjectRef.from_body(body)
    old_status = body.get("status") or {}
    new_status = error_status(old_status, ref.generation, error_message(error), now)
    patch = status_patch(old_status, new_status)
    written = client.patch_status(ref.namespace, ref.name, patch) if patch else None
    if written:
        world.remember(api.KIND, ref.namespace, ref.name, slim(written), resource_version(written))
    if patch and written is None:
        return  # the object is gone
    post_events(client, body, ref, pass_events(old_status, new_status), now)
