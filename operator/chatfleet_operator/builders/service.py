"""The Service in front of the stable track: HTTP, gRPC, metrics and the chat API."""

from __future__ import annotations

from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import object_meta, selector_labels, service_name, with_desired_hash
from chatfleet_operator.spec import ObjectRef

#: (name, port, appProtocol) of every port a Triton pod serves (docs/pod-contract.md).
PORTS = (("http", 8000, "http"), ("grpc", 8001, "grpc"), ("metrics", 8002, "http"), ("chat", 8080, "http"))


def build_service(ref: ObjectRef, track: str = api.TRACK_STABLE) -> dict[str, Any]:
    """ClusterIP Service selecting the pods of one track."""
    return with_desired_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(ref, service_name(ref), {"app.kubernetes.io/component": "server"}),
            "spec": {
                "type": "ClusterIP",
                "selector": selector_labels(ref, track),
                "ports": [
                    {"name": name, "port": port, "targetPort": name, "protocol": "TCP", "appProtocol": proto}
                    for name, port, proto in PORTS
                ],
            },
        }
    )
