"""Every kind the operator reads, writes or watches, in one table: API path, watch index, deletable, change signature.

main.py registers a kopf index and an event handler per watched kind from it, the cache snapshots the
children of a ChatbotService through its indexes, kube.py builds REST paths from it, and the pass
deletes only the kinds marked deletable. Adding an owned kind is one row here (plus its builder).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.converge import facts


class Watch(Enum):
    """How a kind is watched."""

    NONE = "none"  # read or written, never watched (ConfigMaps, Events); Secrets: never touched
    CHILD = "child"  # owned objects labelled managed-by: indexed by owner, an event triggers the owner
    POD = "pod"  # pods of a ChatbotService: indexed as PodFacts; problem signals trigger the owner
    NODE = "node"  # nodes: indexed as NodeFacts; changes retry ChatbotServices waiting for a GPU node
    OWNER = "owner"  # the ChatbotService itself


@dataclass(frozen=True)
class Kind:
    """One kind: where it is served, how it is watched, and what about it makes a new pass worthwhile."""

    name: str
    group: str
    version: str
    plural: str
    watch: Watch = Watch.NONE
    index: str = ""
    """kopf index name ('' when not watched)."""
    deletable: bool = False
    """The pass deletes it when no longer desired (the HPA or ScaledObject when autoscaling is turned off, or
    the other one when the metrics path changes); only objects the ChatbotService controls (not the HPA
    KEDA makes from the ScaledObject)."""
    signature: Callable[[Mapping[str, Any]], tuple[Any, ...]] = facts.content_signature_of

    @property
    def prefix(self) -> str:
        """REST path prefix, e.g. /api/v1 or /apis/apps/v1."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


KINDS: tuple[Kind, ...] = (
    Kind(
        "Deployment",
        "apps",
        "v1",
        "deployments",
        Watch.CHILD,
        "deployment_index",
        signature=facts.deployment_signature,
    ),
    Kind("Service", "", "v1", "services", Watch.CHILD, "service_index"),
    Kind(
        "HorizontalPodAutoscaler",
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        Watch.CHILD,
        "hpa_index",
        True,
        signature=facts.autoscaler_signature,
    ),
    # Written instead of the HPA when the cluster serves KEDA (autoscale/measure.py discovers it);
    # watched only once its CRD is there (kopf resolves resources as the cluster serves them).
    Kind(
        "ScaledObject",
        "keda.sh",
        "v1alpha1",
        "scaledobjects",
        Watch.CHILD,
        "scaledobject_index",
        True,
        signature=facts.autoscaler_signature,
    ),
    # Deleted when the spec comes down to one pod (builders/pdb.py).
    Kind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", Watch.CHILD, "pdb_index", True),
    # Written when the cluster serves Gateway API (release/measure.py discovers it); watched only once its
    # CRD is there, like the ScaledObject. Unwatched, every pass of a release saw it missing and applied it.
    # Its signature holds the Gateways' Accepted and ResolvedRefs (condition RouteServed, release/route.py).
    Kind(
        "HTTPRoute",
        facts.GATEWAY_GROUP,
        "v1",
        "httproutes",
        Watch.CHILD,
        "httproute_index",
        signature=facts.httproute_signature,
    ),
    # Traefik's mirror of a release's shadow phase (--gateway-mirror TraefikService): written only then, and
    # deleted after; watched once Traefik's CRDs are there.
    Kind(
        "TraefikService",
        "traefik.io",
        "v1alpha1",
        "traefikservices",
        Watch.CHILD,
        "traefikservice_index",
        True,
    ),
    # InferencePool routing (the cluster serves the Gateway API Inference Extension; builders/
    # inferencepool.py): a pool per track, watched once its CRD is there; its status.parents has the
    # HTTPRoute's shape (the Gateway's Accepted and ResolvedRefs: status.routing.pools). Deleted when the
    # routing goes back to Services.
    Kind(
        "InferencePool",
        "inference.networking.k8s.io",
        "v1",
        "inferencepools",
        Watch.CHILD,
        "inferencepool_index",
        True,
        signature=facts.httproute_signature,
    ),
    Kind("Pod", "", "v1", "pods", Watch.POD, "pod_index", signature=facts.pod_signature),
    Kind("Node", "", "v1", "nodes", Watch.NODE, "node_index", signature=facts.node_signature),
    # Read by name only: the golden prompts of spec.analysis.quality.promptsFrom (the operator owns none;
    # the Triton config rides in the pod template).
    Kind("ConfigMap", "", "v1", "configmaps"),
    Kind("Event", "", "v1", "events"),
    Kind(api.KIND, api.GROUP, api.VERSION, api.PLURAL, Watch.OWNER, "cbs_index"),
)

BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
#: Owned children of a ChatbotService that are watched, in the order a snapshot lists them.
CHILDREN: tuple[Kind, ...] = tuple(k for k in KINDS if k.watch == Watch.CHILD)
#: Kinds the pass may delete when no longer desired.
DELETABLE: tuple[str, ...] = tuple(k.name for k in KINDS if k.deletable)
#: Children of any kind the pass may delete when no longer desired, by their component label: the
#: endpoint picker's Deployment and Service when the routing goes back to Services, the stream relay's
#: Deployment and Services when spec.streamRelay is turned off (builders/inferencepool.py, relay.py).
DELETABLE_COMPONENTS: tuple[str, ...] = ("endpoint-picker", "stream-relay")
#: kind -> (API path prefix, plural) of every kind kube.py reads or writes (pods and nodes are only watched).
API_PATHS: dict[str, tuple[str, str]] = {
    k.name: (k.prefix, k.plural) for k in KINDS if k.watch not in (Watch.POD, Watch.NODE)
}


def change_signature(kind: str, body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What about an object makes a new pass worthwhile (equal signatures -> no pass), per the table."""
    entry = BY_NAME.get(kind)
    return (entry.signature if entry else facts.content_signature_of)(body)
