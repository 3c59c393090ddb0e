"""The Services of one ChatbotService: the chat API's chat port (and the canary's shadow port), selecting the
pods of a track. Nothing else of a pod is behind a Service: Triton listens on the pod's loopback, and the
admin and scrape ports are reached on the pods themselves (docs/security.md "Ports")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import object_meta, with_desired_hash
from chatfleet_operator.builders.deployment import CHAT_PORT, SHADOW_PORT
from chatfleet_operator.spec import ObjectRef

#: (name, port, appProtocol) of the one port end users reach: the chat API's (docs/pod-contract.md).
PORTS = (("chat", CHAT_PORT, "http"),)
#: The canary's Service adds the chat API's shadow port: where a gateway mirrors live requests to it.
SHADOW = ("shadow", SHADOW_PORT, "http")


def track_service_name(ref: ObjectRef, track: str) -> str:
    """Service of one track: `<name>-canary`, `<name>-preview` (the stable one is `<name>`)."""
    return ref.name if track == api.TRACK_STABLE else f"{ref.name}-{track}"


def build_service(
    ref: ObjectRef,
    name: str,
    selector: Mapping[str, str],
    *,
    affinity_seconds: int | None = None,
    component: str = "server",
    shadow_port: bool = False,
) -> dict[str, Any]:
    """ClusterIP Service `name` with an explicit selector (and ClientIP affinity when asked).

    e.g. build_service(ref, "bot", {"chatfleet.io/service": "bot"}, affinity_seconds=3600): both tracks,
    a client's turns kept on one pod for an hour. `shadow_port`: the shadow port too (the canary's).
    """
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": dict(selector),
        "ports": [
            {"name": n, "port": port, "targetPort": n, "protocol": "TCP", "appProtocol": proto}
            for n, port, proto in (*PORTS, SHADOW)
            if shadow_port or n != SHADOW[0]
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
