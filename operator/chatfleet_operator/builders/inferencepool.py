"""InferencePool routing: one InferencePool per serving track and the endpoint picker they name. Pure.

Where the cluster serves the Gateway API Inference Extension (`inference.networking.k8s.io/v1`), a
canary's HTTPRoute sends its weights to InferencePools instead of Services (release/router.py):
- InferencePool `<name>` (stable) and `<name>-canary`, each selecting its track's pods on the chat port;
- their `endpointPickerRef` is Service `<name>-picker`, one gRPC port per pool (stable 9002, canary 9003),
  so the one picker of the ChatbotService knows which pool the route's weights chose and keeps one
  dialogue table across both (chatfleet_picker: dialogue affinity, revision stickiness, load);
- the picker runs as Deployment `<name>-picker` (one replica: its dialogue table is in memory) from the
  picker image (--picker-image; the chart sets the operator's own image), under the namespace's
  ServiceAccount --picker-service-account (chatfleet-picker), whose Role lets it list and watch pods.
  The chart writes that ServiceAccount, Role and RoleBinding in the fleets' namespaces; the operator
  writes no RBAC (it could only grant what it holds, but an operator that writes RoleBindings is an
  escalation path nobody needs). Where it runs: any node, unless --picker-node-selector and
  --picker-toleration place it (e.g. on a system node pool; the fleet's GPU nodes need not host it).

The picker's pods carry no `chatfleet.io/service` label: no Service, pool or autoscaler of the fleet
selects them, and the fleets' NetworkPolicy leaves their ports to the one of their own (the chart).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import helper_pod_labels, object_meta, with_desired_hash
from chatfleet_operator.builders.deployment import CHAT_PORT, SCRAPE_PORT, container_security
from chatfleet_operator.builders.service import track_service_name
from chatfleet_operator.spec import ObjectRef

POOL_GROUP, POOL_VERSION = "inference.networking.k8s.io", "v1"
COMPONENT = "endpoint-picker"
#: The picker's gRPC port per pool (track) and its own metrics port.
PICKER_PORTS = {api.TRACK_STABLE: 9002, api.TRACK_CANARY: 9003}
PICKER_METRICS_PORT = 9090
#: Requests in flight at which a replica counts as saturated (the picker moves a dialogue off it then).
PICKER_MAX_QUEUE = 8


def pool_name(ref: ObjectRef, track: str) -> str:
    """InferencePool per track, named as the track's Service: `<name>`, `<name>-canary`."""
    return track_service_name(ref, track)


def picker_name(ref: ObjectRef) -> str:
    return f"{ref.name}-picker"


def picker_labels(ref: ObjectRef) -> dict[str, str]:
    """The picker pods' labels (no chatfleet.io/service: nothing of the fleet selects them)."""
    return helper_pod_labels(ref, "chatfleet-picker", COMPONENT)


def build_inference_pool(ref: ObjectRef, track: str) -> dict[str, Any]:
    """InferencePool of one track: its pods' chat port, picked by the picker's port for that track."""
    return with_desired_hash(
        {
            "apiVersion": f"{POOL_GROUP}/{POOL_VERSION}",
            "kind": "InferencePool",
            "metadata": object_meta(ref, pool_name(ref, track), {api.LABEL_COMPONENT: "traffic"}),
            "spec": {
                "selector": {"matchLabels": {api.LABEL_SERVICE: ref.name, api.LABEL_TRACK: track}},
                "targetPorts": [{"number": CHAT_PORT}],
                "endpointPickerRef": {
                    "name": picker_name(ref),
                    "port": {"number": PICKER_PORTS[track]},
                    # a picker outage fails the pool's requests rather than routing them blind: the
                    # gateway would otherwise break dialogue and revision pinning mid-release
                    "failureMode": "FailClose",
                },
            },
        }
    )


def placement(
    node_selector: Sequence[tuple[str, str]], tolerations: Sequence[tuple[str, str | None, str]]
) -> dict[str, Any]:
    """A pod spec's nodeSelector and tolerations, each only when set. A toleration's value None matches
    any value (operator Exists); an empty effect, every effect."""
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = dict(node_selector)
    if tolerations:
        out["tolerations"] = [
            {
                "key": key,
                **({"operator": "Exists"} if value is None else {"operator": "Equal", "value": value}),
                **({"effect": effect} if effect else {}),
            }
            for key, value, effect in tolerations
        ]
    return out


def build_picker(
    ref: ObjectRef,
    image: str,
    service_account: str,
    node_selector: Sequence[tuple[str, str]] = (),
    tolerations: Sequence[tuple[str, str | None, str]] = (),
) -> list[dict[str, Any]]:
    """The picker's Deployment (under `service_account`, placed by `node_selector` and `tolerations`, as
    ReleaseSettings holds them) and Service."""
    name, labels = picker_name(ref), picker_labels(ref)

    def meta() -> dict[str, Any]:
        return object_meta(ref, name, {api.LABEL_COMPONENT: COMPONENT})

    selector = f"{api.LABEL_SERVICE}={ref.name}"
    args = [
        "--host=0.0.0.0",
        *(f"--pool={track}={port}" for track, port in PICKER_PORTS.items()),
        f"--namespace={ref.namespace}",
        f"--selector={selector}",
        f"--target-port={CHAT_PORT}",
        f"--pod-metrics-port={SCRAPE_PORT}",
        f"--metrics-port={PICKER_METRICS_PORT}",
        f"--max-queue={PICKER_MAX_QUEUE}",
        f"--route={ref.name}",  # the HTTPRoute's weights (build_httproute names it after the bot)
        *(f"--pool-name={track}={pool_name(ref, track)}" for track in PICKER_PORTS),
    ]
    grpc_ports = [
        {"name": f"grpc-{track}", "containerPort": port, "protocol": "TCP"}
        for track, port in PICKER_PORTS.items()
    ]
    container = {
        "name": "picker",
        "image": image,
        "command": ["python", "-m", "chatfleet_picker"],
        "args": args,
        "ports": [*grpc_ports, {"name": "metrics", "containerPort": PICKER_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": PICKER_PORTS[api.TRACK_STABLE]}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": container_security(),
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {api.LABEL_INSTANCE: ref.name, api.LABEL_COMPONENT: COMPONENT}},
            # one picker at a time: two would split the dialogue table
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": service_account,
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    **placement(node_selector, tolerations),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(),
        "spec": {
            "type": "ClusterIP",
            "selector": {api.LABEL_INSTANCE: ref.name, api.LABEL_COMPONENT: COMPONENT},
            "ports": [
                {
                    "name": f"grpc-{track}",
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                }
                for track, port in PICKER_PORTS.items()
            ],
        },
    }
    return [with_desired_hash(o) for o in (deployment, service)]
