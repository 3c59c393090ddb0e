"""Objects of a release: per-track Services, the Gateway API HTTPRoute, the canary's own ConfigMap.

Conversations stay on their track while the split moves (docs/releases.md):
- HTTPRoute: rules matching the header `x-chatfleet-track: stable|canary` go to that track only; the
  chat API answers every turn with that header (its pod's track), so a client -- or the chat gateway in
  front -- that echoes it keeps a conversation on the track it began on. Requests without it are split
  by the weights.
- Replica ratio: the one Service uses `sessionAffinity: ClientIP` (timeout = the session TTL), so a
  client's turns keep reaching the same pod, hence the same track, while that pod lives.
In both cases the conversation history lives in Redis, so a turn that does move (its pod went away on
promotion or rollback) keeps its context.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import configmap_name, object_meta, with_desired_hash
from chatfleet_operator.builders.service import PORTS
from chatfleet_operator.spec import ObjectRef

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
TRACK_HEADER = "x-chatfleet-track"
CHAT_PORT = 8080


def track_service_name(ref: ObjectRef, track: str) -> str:
    """Service of one track: `<name>-canary`, `<name>-preview` (the stable one is `<name>`)."""
    return ref.name if track == api.TRACK_STABLE else f"{ref.name}-{track}"


def canary_configmap_name(ref: ObjectRef, track: str) -> str:
    """Triton config of the canary/preview revision, apart from stable's: `<name>-<track>-triton`."""
    return f"{ref.name}-{track}-triton"


def build_selector_service(
    ref: ObjectRef,
    name: str,
    selector: Mapping[str, str],
    *,
    affinity_seconds: int | None = None,
    component: str = "server",
) -> dict[str, Any]:
    """ClusterIP Service with an explicit selector (and ClientIP affinity when asked)."""
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": dict(selector),
        "ports": [
            {"name": n, "port": port, "targetPort": n, "protocol": "TCP", "appProtocol": proto}
            for n, port, proto in PORTS
        ],
    }
    if affinity_seconds:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": min(86400, max(1, affinity_seconds))}}
    return with_desired_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(ref, name, {api.LABEL_COMPONENT: component}),
            "spec": spec,
        }
    )


def build_httproute(
    ref: ObjectRef,
    *,
    stable_weight: int,
    canary_weight: int,
    gateway_name: str,
    gateway_namespace: str | None = None,
) -> dict[str, Any]:
    """HTTPRoute `<name>` splitting the chat port between the stable and canary Services by weight.

    e.g. canary_weight 20 -> backendRefs [<name> weight 80, <name>-canary weight 20]; two more rules pin
    requests carrying `x-chatfleet-track` to their track.
    """
    stable_ref = {"name": track_service_name(ref, api.TRACK_STABLE), "port": CHAT_PORT}
    canary_ref = {"name": track_service_name(ref, api.TRACK_CANARY), "port": CHAT_PORT}
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway_name}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace
    rules: list[dict[str, Any]] = []
    if canary_weight > 0:
        rules.append(
            {
                "matches": [{"headers": [{"name": TRACK_HEADER, "value": api.TRACK_CANARY}]}],
                "backendRefs": [{**canary_ref, "weight": 1}],
            }
        )
    rules.append(
        {
            "matches": [{"headers": [{"name": TRACK_HEADER, "value": api.TRACK_STABLE}]}],
            "backendRefs": [{**stable_ref, "weight": 1}],
        }
    )
    rules.append(
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "backendRefs": [{**stable_ref, "weight": stable_weight}, {**canary_ref, "weight": canary_weight}],
        }
    )
    return with_desired_hash(
        {
            "apiVersion": f"{GATEWAY_GROUP}/{GATEWAY_VERSION}",
            "kind": "HTTPRoute",
            "metadata": object_meta(ref, ref.name, {api.LABEL_COMPONENT: "traffic"}),
            "spec": {"parentRefs": [parent], "rules": rules},
        }
    )


def retarget_configmap(deployment: Mapping[str, Any], ref: ObjectRef, configmap: str) -> dict[str, Any]:
    """A Deployment manifest whose Triton config volume reads `configmap` instead of `<name>-triton`."""
    out = copy.deepcopy(dict(deployment))
    for volume in out["spec"]["template"]["spec"].get("volumes", []):
        if (volume.get("configMap") or {}).get("name") == configmap_name(ref):
            volume["configMap"]["name"] = configmap
    return with_desired_hash(out)


def renamed_configmap(configmap: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A copy of a ConfigMap manifest under another name."""
    out = copy.deepcopy(dict(configmap))
    out["metadata"]["name"] = name
    return with_desired_hash(out)


def keep_template(observed: Mapping[str, Any], desired: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """The desired Deployment manifest, but with the observed pod template: stable keeps its revision.

    Used while a release is in progress or rolled back: the spec describes the new revision, yet the
    stable Deployment must go on running the old one; only its replica count changes.
    """
    out = copy.deepcopy(dict(desired))
    template = copy.deepcopy((observed.get("spec") or {}).get("template") or out["spec"]["template"])
    out["spec"]["template"] = template
    out["spec"]["replicas"] = replicas
    labels = (template.get("metadata") or {}).get("labels") or {}
    if labels.get(api.LABEL_REVISION):
        out["metadata"]["labels"][api.LABEL_REVISION] = labels[api.LABEL_REVISION]
    return with_desired_hash(out)
