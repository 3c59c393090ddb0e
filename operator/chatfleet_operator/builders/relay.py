"""The stream relay in front of the fleet (spec.streamRelay). Pure.

When enabled, three objects, all labelled component `stream-relay` (the pass deletes them once it is off):
- Service `<name>-replicas`: the pods Service `<name>` selects, on the chat port, with no session affinity
  (ClientIP affinity would send every stream of one relay pod to one replica);
- Deployment `<name>-relay`: `python -m chatfleet_runtime.relay --balanced` from the runtime image, its one
  upstream that Service's ClusterIP (known once the Service exists: the relay needs no cluster DNS), so a
  cut stream is resumed through it again and reaches another replica; no ServiceAccount token, no service
  links, the fleet's node selector and tolerations;
- Service `<name>-relay`: the relay pods' chat port, the address end users call for resumable streams.

The relay pods carry no `chatfleet.io/service` label: no Service, PDB, pool or autoscaler of the fleet
selects them. Their metrics port (RELAY_METRICS_PORT) is not behind any Service: Prometheus scrapes the pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import helper_pod_labels, object_meta, with_desired_hash
from chatfleet_operator.builders.deployment import CHAT_PORT, container_security
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

COMPONENT = "stream-relay"
RELAY_METRICS_PORT = 9400


def replicas_service_name(ref: ObjectRef) -> str:
    return f"{ref.name}-replicas"


def relay_name(ref: ObjectRef) -> str:
    return f"{ref.name}-relay"


def relay_pod_labels(ref: ObjectRef) -> dict[str, str]:
    """The relay pods' labels (no chatfleet.io/service: nothing of the fleet selects them)."""
    return helper_pod_labels(ref, "chatfleet-relay", COMPONENT)


def _chat_service(ref: ObjectRef, name: str, selector: Mapping[str, str]) -> dict[str, Any]:
    """A ClusterIP Service of the relay's objects: `selector`'s pods on the chat port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(ref, name, {api.LABEL_COMPONENT: COMPONENT}),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [
                {
                    "name": "chat",
                    "port": CHAT_PORT,
                    "targetPort": "chat",
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def build_replicas_service(ref: ObjectRef, selector: Mapping[str, str]) -> dict[str, Any]:
    """Service `<name>-replicas`: `selector` (Service `<name>`'s) on the chat port, no affinity."""
    return with_desired_hash(_chat_service(ref, replicas_service_name(ref), selector))


#: How much longer than spec.runtime.requestTimeoutSeconds the relay waits for a replica's first byte.
FIRST_BYTE_MARGIN_SECONDS = 30


def relay_args(spec: ChatbotServiceSpec, upstream_ip: str) -> list[str]:
    """The relay's arguments, e.g. [..., '--upstream=http://10.96.0.17:8080', '--balanced', ...]."""
    relay = spec.stream_relay
    return [
        "--host=0.0.0.0",
        f"--port={CHAT_PORT}",
        f"--metrics-port={RELAY_METRICS_PORT}",
        f"--upstream=http://{upstream_ip}:{CHAT_PORT}",
        "--balanced",
        f"--stall-seconds={relay.stall_seconds}",
        f"--max-resumes={relay.max_resumes}",
        # the chat API answers within its request timeout (a fallback at worst): a replica silent longer
        # before its answer began is gone (a lost node), and the request goes to another
        f"--first-byte-seconds={spec.runtime.request_timeout_seconds + FIRST_BYTE_MARGIN_SECONDS}",
        "--log-level=warning",
    ]


def build_relay(ref: ObjectRef, spec: ChatbotServiceSpec, upstream_ip: str) -> list[dict[str, Any]]:
    """The relay's Deployment (through `upstream_ip`, Service `<name>-replicas`'s ClusterIP) and Service."""
    name, labels = relay_name(ref), relay_pod_labels(ref)
    rt, res = spec.runtime, spec.resources
    container = {
        "name": "relay",
        "image": rt.image,
        "imagePullPolicy": rt.image_pull_policy,
        "command": ["python3", "-m", "chatfleet_runtime.relay"],
        "args": relay_args(spec, upstream_ip),
        "ports": [
            {"name": "chat", "containerPort": CHAT_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": RELAY_METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"tcpSocket": {"port": "chat"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "chat"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": container_security(),
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
    }
    if res.node_selector:
        pod_spec["nodeSelector"] = dict(res.node_selector)
    if res.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in res.tolerations]
    if rt.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in rt.image_pull_secrets]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(ref, name, {api.LABEL_COMPONENT: COMPONENT}),
        "spec": {
            "replicas": spec.stream_relay.replicas,
            "selector": {"matchLabels": {api.LABEL_INSTANCE: ref.name, api.LABEL_COMPONENT: COMPONENT}},
            # a relay pod leaving ends the streams it holds: never more than one at a time
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    service = _chat_service(ref, name, {api.LABEL_INSTANCE: ref.name, api.LABEL_COMPONENT: COMPONENT})
    return [with_desired_hash(o) for o in (deployment, service)]


def relay_objects(
    ref: ObjectRef, spec: ChatbotServiceSpec, main_service: Mapping[str, Any] | None, observed_ip: str
) -> list[dict[str, Any]]:
    """Every relay object of this pass: none when off; the replicas Service (Service `<name>`'s selector,
    `main_service` the pass builds); the relay itself once that Service's ClusterIP is known (`observed_ip`,
    '' until the API server gave it one: the next pass builds it)."""
    if not spec.stream_relay.enabled or main_service is None:
        return []
    objects = [build_replicas_service(ref, main_service["spec"]["selector"])]
    if observed_ip and observed_ip != "None":
        objects += build_relay(ref, spec, observed_ip)
    return objects
