"""The traffic object of a canary release: the Gateway API HTTPRoute splitting the chat port by weight.

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

from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import object_meta, with_desired_hash
from chatfleet_operator.builders.service import track_service_name
from chatfleet_operator.spec import ObjectRef

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
TRACK_HEADER = "x-chatfleet-track"
CHAT_PORT = 8080


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
