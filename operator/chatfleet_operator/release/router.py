"""The traffic router: a strategy's traffic intent -> the Services, HTTPRoute and gateway-specific
objects that carry it. Pure.

A strategy says what it wants of the traffic this pass (`TrafficIntent`: which pods the main Service
selects and with what affinity, whether the new track has a Service of its own, and, behind Gateway API,
a weighted route with its pinned revisions, its header rules and its mirror). This module alone knows how
that is spelt:
a ClusterIP Service with ClientIP affinity, a Gateway API HTTPRoute, Traefik's TraefikService where
the gateway lacks the RequestMirror filter, or -- where the cluster serves the Gateway API Inference
Extension -- an InferencePool per track and their endpoint picker behind the route (ctx.backends). A
strategy routing by a header names it in its intent (`HeaderMatch`); another mirror method or another
gateway is an edit here, not in a strategy (Argo Rollouts' TrafficRoutingReconciler, Flagger's
router.Interface).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.httproute import (
    REQUEST_MIRROR,
    TRAEFIK_SERVICE,
    HeaderMatch,
    Mirror,
    build_httproute,
    build_traefik_mirror,
)
from chatfleet_operator.builders.inferencepool import POOL_GROUP, build_inference_pool, build_picker
from chatfleet_operator.builders.service import build_service, track_service_name
from chatfleet_operator.context import PassContext
from chatfleet_operator.release.traffic import POOL_BACKENDS
from chatfleet_operator.spec import ObjectRef


@dataclass(frozen=True)
class WeightedRoute:
    """Behind Gateway API: the canary's share, the revisions pinned to their track, the shadow mirror."""

    canary_weight: int
    pins: Mapping[str, str] = field(default_factory=dict)
    """Revision -> track of the route's pinned rules (sticky dialogues)."""
    mirror: Mirror | None = None
    matches: Sequence[HeaderMatch] = ()
    """Header rules of the strategy's own, after the pinned ones (e.g. an A/B variant header)."""


@dataclass(frozen=True)
class TrafficIntent:
    """What a strategy wants of the traffic this pass."""

    track: str
    """The new revision's track (canary, preview)."""
    selector: Mapping[str, str] = field(default_factory=dict)
    """Labels narrowing the main Service `<name>` to the pods that take user traffic (none: every pod)."""
    affinity_seconds: int | None = None
    """ClientIP affinity of the main Service (a client's turns kept on one pod); None: none."""
    track_service: bool = True
    """Whether the new track gets its Service `<name>-<track>` (probes, previews, the route's backend)."""
    route: WeightedRoute | None = None
    """A weighted HTTPRoute in front of the Services; None: the Services alone carry the traffic."""


def service_selector(ref: ObjectRef, **labels: str) -> dict[str, str]:
    """Label selector of this ChatbotService's pods, narrowed by `labels`. e.g. track="canary"."""
    return {api.LABEL_SERVICE: ref.name, **labels}


def track_service(ref: ObjectRef, track: str) -> dict[str, Any]:
    """The Service of the new revision's track, `<name>-<track>`, selecting only that track's pods; the
    canary's carries the shadow port (where a gateway mirrors requests in the shadow phase)."""
    selector = service_selector(ref, **{api.LABEL_TRACK: track})
    name = track_service_name(ref, track)
    return build_service(ref, name, selector, component=track, shadow_port=track == api.TRACK_CANARY)


def traffic_objects(ctx: PassContext, intent: TrafficIntent) -> list[dict[str, Any]]:
    """The objects that carry `intent`: [route, gateway extras,] the main Service[, the track's Service].
    Gateway extras: the TraefikService mirror, or the InferencePools and their picker's objects."""
    ref = ctx.ref
    main = build_service(
        ref, ref.name, service_selector(ref, **intent.selector), affinity_seconds=intent.affinity_seconds
    )
    objects = [main, track_service(ref, intent.track)] if intent.track_service else [main]
    if intent.route is None:
        return objects
    w, release = intent.route.canary_weight, ctx.settings.release
    pools = ctx.backends == POOL_BACKENDS
    mirror = intent.route.mirror
    if pools and mirror is not None:  # an Inference Extension gateway mirrors by Gateway API's filter
        mirror = replace(mirror, method=REQUEST_MIRROR)
    route = build_httproute(
        ref,
        stable_weight=100 - w,
        canary_weight=w,
        gateway_name=release.gateway_name,
        gateway_namespace=release.gateway_namespace,
        pins=dict(intent.route.pins),
        hostnames=ctx.spec.rollout.hostnames,
        mirror=mirror,
        pool_group=POOL_GROUP if pools else None,
        matches=intent.route.matches,
    )
    if pools:
        extra = [build_inference_pool(ref, track) for track in (api.TRACK_STABLE, api.TRACK_CANARY)]
        extra += build_picker(
            ref,
            release.picker_image,
            release.picker_service_account,
            release.picker_node_selector,
            release.picker_tolerations,
        )
    else:
        extra = (
            [build_traefik_mirror(ref, mirror.percent)] if mirror and mirror.method == TRAEFIK_SERVICE else []
        )
    return [route, *extra, *objects]
