"""kopf registrations only: each handler is one line of docstring and delegates to the Controller.

The Controller is created by `cli.py` (which wires the API module in) and installed with `install()`
before kopf starts, so this module never imports the Kubernetes client.
"""

from __future__ import annotations

from typing import Any

import kopf

from chatfleet_operator import api
from chatfleet_operator.cache import owner_key, slim
from chatfleet_operator.controller import Controller
from chatfleet_operator.converge.facts import node_facts, pod_facts
from chatfleet_operator.kopfext import LeanDiffBaseStorage

MANAGED = {api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE}
OWNED = {api.LABEL_SERVICE: kopf.PRESENT}
CBS = (api.GROUP, api.VERSION, api.PLURAL)

_controller: Controller | None = None


def install(controller: Controller) -> None:
    """Install the Controller the handlers delegate to (called by cli before kopf starts)."""
    global _controller
    _controller = controller


def controller_for(kwargs: dict[str, Any]) -> Controller:
    """The installed Controller, with kopf's indexes attached."""
    assert _controller is not None, "chatfleet_operator.main.install() was not called"
    _controller.use_indexes(kwargs)
    return _controller


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Tune kopf so that steady state writes nothing: no log events, annotation-only bookkeeping."""
    settings.posting.enabled = False
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="operator.chatfleet.io")
    settings.persistence.diffbase_storage = LeanDiffBaseStorage(
        prefix="operator.chatfleet.io", key="last-handled-configuration"
    )
    settings.watching.server_timeout = 600
    settings.networking.error_backoffs = (1, 2, 4, 8, 16, 30)


# Watch caches (kopf indexes). kopf fills them all before any handler runs, so a restarted operator
# sees every owned object before its first pass, and plans no spurious writes.


@kopf.index(*CBS)
def cbs_index(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Index ChatbotServices by (namespace, name)."""
    return {(namespace, name): slim(body)}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def deployment_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """Index owned Deployments by owner."""
    key = owner_key(namespace, labels)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "configmaps", labels=MANAGED)
def configmap_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """Index owned ConfigMaps by owner."""
    key = owner_key(namespace, labels)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "services", labels=MANAGED)
def service_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """Index owned Services by owner."""
    key = owner_key(namespace, labels)
    return {key: slim(body)} if key else None


@kopf.index("autoscaling", "v2", "horizontalpodautoscalers", labels=MANAGED)
def hpa_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """Index owned HPAs by owner."""
    key = owner_key(namespace, labels)
    return {key: slim(body)} if key else None


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
def pdb_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """Index owned PodDisruptionBudgets by owner."""
    key = owner_key(namespace, labels)
    return {key: slim(body)} if key else None


@kopf.index("", "v1", "pods", labels=OWNED)
def pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
    """Index pods of ChatbotServices by owner, reduced to PodFacts."""
    key = owner_key(namespace, labels)
    return {key: pod_facts(body)} if key else None


@kopf.index("", "v1", "nodes")
def node_index(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Index nodes, reduced to NodeFacts (GPU product, allocatable GPUs)."""
    return {"nodes": node_facts(body)}


# The ChatbotService itself.


@kopf.on.resume(*CBS)
@kopf.on.create(*CBS)
@kopf.on.update(*CBS)
async def reconcile(body: kopf.Body, retry: int, **kwargs: Any) -> None:
    """Reconcile a ChatbotService; unsatisfiable specs retry with a growing delay."""
    await controller_for(kwargs).handle(body, retry)


@kopf.on.event(*CBS)
async def chatbotservice_event(type: str, body: kopf.Body, namespace: str, name: str, **kwargs: Any) -> None:
    """Trigger a pass on a spec change not yet observed (also while kopf's retry is backing off)."""
    observed = (body.get("status") or {}).get("observedGeneration")
    if type == "DELETED":
        controller_for(kwargs).forget((namespace, name))
    elif observed is not None and body.get("metadata", {}).get("generation") != observed:
        controller_for(kwargs).trigger((namespace, name))


# Owned objects and pods: any change (a pod got Ready, a hand edit, a deletion) triggers the owner.


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def deployment_event(
    type: str, body: kopf.Body, namespace: str, labels: kopf.Labels, **kwargs: Any
) -> None:
    """Trigger the owner when a Deployment's content or rollout counts changed."""
    controller_for(kwargs).child_event("Deployment", type, body, owner_key(namespace, labels))


@kopf.on.event("", "v1", "configmaps", labels=MANAGED)
async def configmap_event(
    type: str, body: kopf.Body, namespace: str, labels: kopf.Labels, **kwargs: Any
) -> None:
    """Trigger the owner of a changed ConfigMap."""
    controller_for(kwargs).child_event("ConfigMap", type, body, owner_key(namespace, labels))


@kopf.on.event("", "v1", "services", labels=MANAGED)
async def service_event(
    type: str, body: kopf.Body, namespace: str, labels: kopf.Labels, **kwargs: Any
) -> None:
    """Trigger the owner of a changed Service."""
    controller_for(kwargs).child_event("Service", type, body, owner_key(namespace, labels))


@kopf.on.event("autoscaling", "v2", "horizontalpodautoscalers", labels=MANAGED)
async def hpa_event(type: str, body: kopf.Body, namespace: str, labels: kopf.Labels, **kwargs: Any) -> None:
    """Trigger the owner of a changed HPA."""
    controller_for(kwargs).child_event("HorizontalPodAutoscaler", type, body, owner_key(namespace, labels))


@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
async def pdb_event(type: str, body: kopf.Body, namespace: str, labels: kopf.Labels, **kwargs: Any) -> None:
    """Trigger the owner of a changed PodDisruptionBudget."""
    controller_for(kwargs).child_event("PodDisruptionBudget", type, body, owner_key(namespace, labels))


@kopf.on.event("", "v1", "pods", labels=OWNED)
async def pod_event(type: str, body: kopf.Body, namespace: str, labels: kopf.Labels, **kwargs: Any) -> None:
    """Trigger the owner when a pod shows or clears a problem (unschedulable, image pull, restarts)."""
    controller_for(kwargs).child_event("Pod", type, body, owner_key(namespace, labels))


@kopf.on.event("", "v1", "nodes")
async def node_event(type: str, body: kopf.Body, **kwargs: Any) -> None:
    """Retry ChatbotServices waiting for a GPU node when nodes appear or change labels or GPUs."""
    controller_for(kwargs).node_event(type, body)
