"""A pass with releases: observed tracks -> release plan -> desired children and release status. Pure.

The reconciler builds the steady-state children (ConfigMap, stable Deployment, Service, PDB, HPA) from the
spec as before, then hands them here; `release_children` replaces what a release changes:
- the stable Deployment keeps its observed template (old revision) while a release runs or after a
  rollback, and only its replica count moves; its ConfigMap is left alone too;
- the canary/preview Deployment runs the spec's revision from its own ConfigMap;
- the Services and, with Gateway API, the HTTPRoute carry the split.
Manifests are returned in the rollback order: traffic objects first, then the stable Deployment, then
the canary -- so traffic is on stable before the canary shrinks.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.analysis.assess import Measurement
from chatfleet_operator.builders.common import configmap_name, deployment_name
from chatfleet_operator.builders.release import (
    build_httproute,
    build_selector_service,
    canary_configmap_name,
    keep_template,
    renamed_configmap,
    retarget_configmap,
    track_service_name,
)
from chatfleet_operator.converge.facts import PodFacts, deployment_facts
from chatfleet_operator.release.planner import (
    ReleaseInput,
    ReleasePlan,
    Track,
    analysis_due,
    plan_release,
)
from chatfleet_operator.release.traffic import HTTPROUTE, REPLACE_IN_PLACE, SURGE
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef, Strategy


def release_track(spec: ChatbotServiceSpec) -> str:
    """Track of the new revision: preview for blue-green, canary otherwise."""
    return api.TRACK_PREVIEW if spec.rollout.strategy == Strategy.BLUE_GREEN else api.TRACK_CANARY


def observe_track(
    body: Mapping[str, Any] | None, pods: Sequence[PodFacts], track: str, revision: str | None = None
) -> Track:
    """Track facts of one Deployment: its template's revision and its Ready pods of that revision."""
    if body is None:
        return Track()
    template = (body.get("spec") or {}).get("template") or {}
    rev = ((template.get("metadata") or {}).get("labels") or {}).get(api.LABEL_REVISION, "")
    rev = revision or rev
    mine = tuple(p for p in pods if p.track == track and not p.deleting)
    ready = sum(1 for p in mine if p.ready and p.revision == rev)
    replicas = (body.get("spec") or {}).get("replicas")
    return Track(rev, int(replicas if replicas is not None else 1), ready, mine, exists=True)


@dataclass
class ReleaseOutcome:
    """What the reconciler needs from the release part of a pass."""

    desired: list[dict[str, Any]]
    plan: ReleasePlan
    serving_revision: str
    canary: Track
    stable_pods_only: bool = True
    events: list[Any] = field(default_factory=list)


def tracks_of(
    ref: ObjectRef,
    spec: ChatbotServiceSpec,
    children: Mapping[tuple[str, str], Mapping[str, Any]],
    pods: Sequence[PodFacts],
) -> tuple[Track, Track]:
    """(stable, canary-or-preview) Track facts from the observed children and pods."""
    stable = observe_track(children.get(("Deployment", deployment_name(ref))), pods, api.TRACK_STABLE)
    track = release_track(spec)
    canary = observe_track(children.get(("Deployment", deployment_name(ref, track))), pods, track)
    return stable, canary


def measurement_due(
    ref: ObjectRef,
    spec: ChatbotServiceSpec,
    old_status: Mapping[str, Any],
    children: Mapping[tuple[str, str], Mapping[str, Any]],
    pods: Sequence[PodFacts],
    now: datetime,
) -> bool:
    """Whether this pass should take an analysis measurement."""
    _, canary = tracks_of(ref, spec, children, pods)
    return analysis_due(spec, old_status, canary, now)


def release_children(
    ref: ObjectRef,
    spec: ChatbotServiceSpec,
    base: Sequence[dict[str, Any]],
    children: Mapping[tuple[str, str], Mapping[str, Any]],
    pods: Sequence[PodFacts],
    old_status: Mapping[str, Any],
    *,
    update_revision: str,
    total: int,
    traffic: str,
    gateway_name: str,
    now: datetime,
    measurement: Measurement | None = None,
) -> ReleaseOutcome:
    """Plan the release of this pass and rewrite the steady-state children accordingly."""
    stable, canary = tracks_of(ref, spec, children, pods)
    track = release_track(spec)
    plan = plan_release(
        ReleaseInput(spec, update_revision, total, stable, canary, traffic, now, measurement),
        old_status,
    )
    by_key = {(m["kind"], m["metadata"]["name"]): m for m in base}
    stable_name, canary_name = deployment_name(ref), deployment_name(ref, track)
    base_dep = by_key[("Deployment", stable_name)]
    base_cm = by_key[("ConfigMap", configmap_name(ref))]
    observed_stable = children.get(("Deployment", stable_name))

    # The stable Deployment: from the spec, or its observed template kept (old revision) at a new size.
    # Replicas are always set, autoscaled or not: the HPA scales the ChatbotService, not a Deployment.
    if plan.stable_from_spec or observed_stable is None:
        stable_dep = keep_template(base_dep, base_dep, plan.stable_replicas)
        serving = update_revision
        stable_cm: dict[str, Any] | None = base_cm
    else:
        stable_dep = keep_template(observed_stable, base_dep, plan.stable_replicas)
        serving = stable.revision or update_revision
        stable_cm = None  # keep the observed ConfigMap of the old revision untouched

    # The canary/preview Deployment: the spec's revision from its own ConfigMap; kept at 0 when idle.
    canary_objs: list[dict[str, Any]] = []
    observed_canary = children.get(("Deployment", canary_name))
    if plan.canary_replicas > 0 or observed_canary is not None:
        cm_name = canary_configmap_name(ref, track)
        canary_dep = _as_track(base_dep, ref, track)
        canary_dep = retarget_configmap(canary_dep, ref, cm_name)
        if plan.canary_replicas == 0 and observed_canary is not None:
            canary_dep = keep_template(observed_canary, canary_dep, 0)
        else:
            canary_dep = keep_template(canary_dep, canary_dep, plan.canary_replicas)
            canary_objs.append(renamed_configmap(base_cm, cm_name))
        canary_objs.append(canary_dep)

    # Traffic objects.
    affinity = spec.runtime.sessions.ttl_seconds
    selector_all = {api.LABEL_SERVICE: ref.name}
    traffic_objs: list[dict[str, Any]] = []
    if spec.rollout.strategy == Strategy.BLUE_GREEN:
        active = {**selector_all, api.LABEL_REVISION: plan.active_revision or serving}
        traffic_objs.append(build_selector_service(ref, ref.name, active, affinity_seconds=affinity))
        traffic_objs.append(
            build_selector_service(
                ref,
                track_service_name(ref, track),
                {**selector_all, api.LABEL_TRACK: track},
                component="preview",
            )
        )
    elif traffic == HTTPROUTE:
        stable_sel = {**selector_all, api.LABEL_TRACK: api.TRACK_STABLE}
        canary_sel = {**selector_all, api.LABEL_TRACK: api.TRACK_CANARY}
        w = plan.canary_weight if plan.in_release and plan.canary_replicas > 0 else 0
        traffic_objs.append(
            build_httproute(ref, stable_weight=100 - w, canary_weight=w, gateway_name=gateway_name)
        )
        traffic_objs.append(build_selector_service(ref, ref.name, stable_sel))
        traffic_objs.append(
            build_selector_service(ref, track_service_name(ref, track), canary_sel, component="canary")
        )
    else:
        traffic_objs.append(build_selector_service(ref, ref.name, selector_all, affinity_seconds=affinity))

    # Rollback order: traffic first (existing Services and routes), then stable grows back, then the
    # canary shrinks. Traffic objects that do not exist yet come last, as the steady state has them:
    # the API server allocates ClusterIPs slowly and pods should not wait behind them.
    rest = [
        m
        for key, m in by_key.items()
        if key not in (("Deployment", stable_name), ("ConfigMap", configmap_name(ref)), ("Service", ref.name))
    ]
    exists = [(m["kind"], m["metadata"]["name"]) in children for m in traffic_objs]
    desired: list[dict[str, Any]] = []
    if stable_cm is not None:
        desired.append(stable_cm)
    desired += [m for m, e in zip(traffic_objs, exists, strict=True) if e]
    desired.append(stable_dep)
    desired += canary_objs
    desired += rest
    desired += [m for m, e in zip(traffic_objs, exists, strict=True) if not e]
    return ReleaseOutcome(desired=desired, plan=plan, serving_revision=serving, canary=canary)


def scale_selector(ref: ObjectRef, spec: ChatbotServiceSpec, plan: ReleasePlan) -> str:
    """status.selector, the pods the HPA averages over (scale subresource): those that take traffic.

    No release: the stable track. Canary: both tracks (each takes its share of the traffic). Blue-green:
    the pods of the revision the active Service selects (the preview takes no user traffic before the
    switch; after it, the old revision takes none).
    e.g. "chatfleet.io/service=bot,chatfleet.io/track=stable"; canary "chatfleet.io/service=bot".
    """
    base = f"{api.LABEL_SERVICE}={ref.name}"
    if not plan.in_release:
        return f"{base},{api.LABEL_TRACK}={api.TRACK_STABLE}"
    if spec.rollout.strategy == Strategy.BLUE_GREEN and plan.active_revision:
        return f"{base},{api.LABEL_REVISION}={plan.active_revision}"
    return base


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


def _as_track(deployment: Mapping[str, Any], ref: ObjectRef, track: str) -> dict[str, Any]:
    """A copy of the stable Deployment manifest relabelled for another track (name, selector, pods)."""
    out = copy.deepcopy(dict(deployment))
    out["metadata"]["name"] = deployment_name(ref, track)
    out["metadata"]["labels"][api.LABEL_TRACK] = track
    out["spec"]["selector"]["matchLabels"][api.LABEL_TRACK] = track
    tmpl = out["spec"]["template"]
    tmpl["metadata"]["labels"][api.LABEL_TRACK] = track
    for c in tmpl["spec"].get("topologySpreadConstraints", []):
        c.get("labelSelector", {}).get("matchLabels", {})[api.LABEL_TRACK] = track
    return out
