"""The traffic object of a canary release: the Gateway API HTTPRoute splitting the chat port by weight.

With spec.rollout.stickyDialogues (docs/releases.md), one more rule per pinned revision matches the header
`x-chatfleet-revision: <hash>` and sends it to the one Service whose pods all run that revision. The chat
API answers every turn with that header (its pod's revision), so a client -- or the chat edge in front --
that echoes it keeps a dialogue on the revision it began on while the weights move, and through the
promotion (release/canary.py keeps the old revision serving until its dialogues end). Requests without
the header are split by the weights. Without pinning, every request is split by the weights alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import object_meta, with_desired_hash
from chatfleet_operator.builders.service import track_service_name
from chatfleet_operator.spec import ObjectRef

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
REVISION_HEADER = "x-chatfleet-revision"
CHAT_PORT = 8080


def build_httproute(
    ref: ObjectRef,
    *,
    stable_weight: int,
    canary_weight: int,
    gateway_name: str,
    gateway_namespace: str | None = None,
    pins: Mapping[str, str] | None = None,
    hostnames: Sequence[str] = (),
) -> dict[str, Any]:
    """HTTPRoute `<name>` splitting the chat port between the stable and canary Services by weight.

    e.g. canary_weight 20 -> backendRefs [<name> weight 80, <name>-canary weight 20]. `pins` maps a
    revision to the track whose Service serves only it: {"a1": "stable", "b2": "canary"} adds, before the
    weighted rule, `x-chatfleet-revision: a1` -> <name> and `x-chatfleet-revision: b2` -> <name>-canary.
    `hostnames` (spec.rollout.hostnames) become the route's; none: every hostname the listener admits.
    """
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway_name}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace

    def backend(track: str) -> dict[str, Any]:
        return {"name": track_service_name(ref, track), "port": CHAT_PORT}

    rules: list[dict[str, Any]] = [
        {
            "matches": [{"headers": [{"name": REVISION_HEADER, "value": revision}]}],
            "backendRefs": [{**backend(track), "weight": 1}],
        }
        for revision, track in sorted((pins or {}).items())
    ]
    rules.append(
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "backendRefs": [
                {**backend(api.TRACK_STABLE), "weight": stable_weight},
                {**backend(api.TRACK_CANARY), "weight": canary_weight},
            ],
        }
    )
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
