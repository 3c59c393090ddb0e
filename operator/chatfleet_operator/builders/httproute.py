"""The traffic object of a canary release: the Gateway API HTTPRoute splitting the chat port by weight.

With spec.rollout.stickyDialogues (docs/releases.md), one more rule per pinned revision matches the header
`x-chatfleet-revision: <hash>` and sends it to the one Service whose pods all run that revision. The chat
API answers every turn with that header (its pod's revision), so a client -- or the chat edge in front --
that echoes it keeps a dialogue on the revision it began on while the weights move, and through the
promotion (release/canary/ keeps the old revision serving until its dialogues end). Requests without
the header are split by the weights. Without pinning, every request is split by the weights alone.

In a release's shadow phase (spec.analysis.quality.shadow) the weighted rule also mirrors a share of its
requests to the canary Service's shadow port; the gateway discards the mirror's answers. Two ways, by
what the gateway implements (operator flag --gateway-mirror):
- RequestMirror: Gateway API's standard filter with `percent` on the weighted rule;
- TraefikService: for Traefik 3.6, whose Gateway provider refuses RequestMirror (it fails the whole
  route): the weighted rule's one backend is TraefikService `<name>-mirror` (Traefik's CRD provider), which
  sends every request to stable's Service and mirrors the share to the canary's shadow port.
Requests a pinned rule matches are not mirrored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import object_meta, with_desired_hash
from chatfleet_operator.builders.deployment import CHAT_PORT, SHADOW_PORT
from chatfleet_operator.builders.service import track_service_name
from chatfleet_operator.spec import ObjectRef

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
REVISION_HEADER = "x-chatfleet-revision"
#: How the gateway mirrors (settings.ReleaseSettings.gateway_mirror).
REQUEST_MIRROR, TRAEFIK_SERVICE = "RequestMirror", "TraefikService"
MIRROR_METHODS = (REQUEST_MIRROR, TRAEFIK_SERVICE)
TRAEFIK_GROUP, TRAEFIK_VERSION = "traefik.io", "v1alpha1"


@dataclass(frozen=True)
class Mirror:
    """The shadow phase's mirror: `percent` of the weighted rule's requests, by `method`."""

    percent: int
    method: str = REQUEST_MIRROR


@dataclass(frozen=True)
class HeaderMatch:
    """A rule before the weighted one: requests whose `header` is `value` go to `track`'s backend, whatever
    the weights (e.g. an A/B variant header a strategy routes by)."""

    header: str
    value: str
    track: str


def mirror_name(ref: ObjectRef) -> str:
    """TraefikService `<name>-mirror` (the TraefikService method)."""
    return f"{ref.name}-mirror"


def build_httproute(
    ref: ObjectRef,
    *,
    stable_weight: int,
    canary_weight: int,
    gateway_name: str,
    gateway_namespace: str | None = None,
    pins: Mapping[str, str] | None = None,
    hostnames: Sequence[str] = (),
    mirror: Mirror | None = None,
    pool_group: str | None = None,
    matches: Sequence[HeaderMatch] = (),
) -> dict[str, Any]:
    """HTTPRoute `<name>` splitting the chat port between the stable and canary Services by weight.

    e.g. canary_weight 20 -> backendRefs [<name> weight 80, <name>-canary weight 20]. `pins` maps a
    revision to the track whose Service serves only it: {"a1": "stable", "b2": "canary"} adds, before the
    weighted rule, `x-chatfleet-revision: a1` -> <name> and `x-chatfleet-revision: b2` -> <name>-canary.
    `hostnames` (spec.rollout.hostnames) become the route's; none: every hostname the listener admits.
    `mirror` (the shadow phase): Mirror(10) adds a RequestMirror filter of 10 % to <name>-canary:8081;
    Mirror(10, "TraefikService") makes TraefikService <name>-mirror the weighted rule's one backend.
    `pool_group` (the Inference Extension's API group): the backends are the tracks' InferencePools, named
    as their Services, instead of the Services (the mirror still goes to the canary Service's shadow port).
    `matches`: header rules after the pinned ones, e.g. HeaderMatch("x-variant", "b", "canary") sends
    `x-variant: b` to <name>-canary.
    """
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway_name}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace

    def backend(track: str) -> dict[str, Any]:
        if pool_group:
            return {"group": pool_group, "kind": "InferencePool", "name": track_service_name(ref, track)}
        return {"name": track_service_name(ref, track), "port": CHAT_PORT}

    pinned = [
        HeaderMatch(REVISION_HEADER, revision, track) for revision, track in sorted((pins or {}).items())
    ]
    rules: list[dict[str, Any]] = [
        {
            "matches": [{"headers": [{"name": m.header, "value": m.value}]}],
            "backendRefs": [{**backend(m.track), "weight": 1}],
        }
        for m in (*pinned, *matches)
    ]
    weighted: dict[str, Any] = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [
            {**backend(api.TRACK_STABLE), "weight": stable_weight},
            {**backend(api.TRACK_CANARY), "weight": canary_weight},
        ],
    }
    if mirror is not None and mirror.method == TRAEFIK_SERVICE:
        weighted["backendRefs"] = [
            {"group": TRAEFIK_GROUP, "kind": "TraefikService", "name": mirror_name(ref), "weight": 100}
        ]
    elif mirror is not None:
        shadow = {"name": track_service_name(ref, api.TRACK_CANARY), "port": SHADOW_PORT}
        weighted["filters"] = [
            {"type": "RequestMirror", "requestMirror": {"backendRef": shadow, "percent": mirror.percent}}
        ]
    rules.append(weighted)
    return with_desired_hash(
        {
            "apiVersion": f"{GATEWAY_GROUP}/{GATEWAY_VERSION}",
            "kind": "HTTPRoute",
            "metadata": object_meta(ref, ref.name, {api.LABEL_COMPONENT: "traffic"}),
            "spec": {
                "parentRefs": [parent],
                **({"hostnames": list(hostnames)} if hostnames else {}),
                "rules": rules,
            },
        }
    )


def build_traefik_mirror(ref: ObjectRef, percent: int) -> dict[str, Any]:
    """TraefikService `<name>-mirror`: every request to stable's Service (chat port), `percent` of them
    mirrored to the canary's shadow port (Traefik discards the mirror's answers)."""
    return with_desired_hash(
        {
            "apiVersion": f"{TRAEFIK_GROUP}/{TRAEFIK_VERSION}",
            "kind": "TraefikService",
            "metadata": object_meta(ref, mirror_name(ref), {api.LABEL_COMPONENT: "traffic"}),
            "spec": {
                "mirroring": {
                    "name": track_service_name(ref, api.TRACK_STABLE),
                    "port": CHAT_PORT,
                    "mirrors": [
                        {
                            "name": track_service_name(ref, api.TRACK_CANARY),
                            "port": SHADOW_PORT,
                            "percent": percent,
                        }
                    ],
                }
            },
        }
    )
