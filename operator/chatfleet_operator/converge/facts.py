"""Small, immutable summaries of what the operator observes (nodes, pods, Deployments, a route's parents).

Watch handlers reduce full objects to these so the in-memory indexes stay small at 1,000s of objects.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any

from chatfleet_operator import api

#: Waiting reasons that mean the image cannot be pulled (the user must fix the image or its secret).
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


def parse_int(value: Any, default: int = 0) -> int:
    """Integer of a quantity-like value ('8', 8, None); `default` when unparsable."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class NodeFacts:
    """What placement needs to know about one node."""

    name: str
    labels: Mapping[str, str]
    allocatable_gpus: int
    schedulable: bool = True

    @property
    def gpu_product(self) -> str | None:
        """NVIDIA GPU product label, if any."""
        return self.labels.get(api.GPU_PRODUCT_LABEL)


def node_facts(body: Mapping[str, Any]) -> NodeFacts:
    """Summarize a Node object."""
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    return NodeFacts(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        allocatable_gpus=parse_int((status.get("allocatable") or {}).get(api.GPU_RESOURCE)),
        schedulable=not spec.get("unschedulable", False),
    )


@dataclass(frozen=True)
class PodFacts:
    """What diagnosis needs to know about one pod of a ChatbotService."""

    name: str
    revision: str
    track: str
    phase: str
    ready: bool
    node_name: str = ""
    unschedulable_message: str = ""
    waiting_reason: str = ""
    waiting_message: str = ""
    restarts: int = 0
    deleting: bool = False
    created: str = ""
    """metadata.creationTimestamp (RFC 3339)."""
    ready_since: str = ""
    """lastTransitionTime of the Ready condition while it is True (RFC 3339); '' when not Ready."""
    serving: str = ""
    """The chatfleet.io/serving label ('' when absent: no warm pool)."""
    deletion_cost: str = ""
    """The controller.kubernetes.io/pod-deletion-cost annotation ('' when absent)."""
    ip: str = ""
    """status.podIP ('' before the pod has one): where the quality gate sends its golden prompts."""
    fallback_digest: str = ""
    """A digest of the chatfleet.io/fallback annotation ('' when absent): whether the pod carries
    spec.fallback as it is now (converge/fallback.py), without keeping the text itself."""
    terminated_message: str = ""
    """The first container's termination message (state.terminated, else lastState.terminated; '' when none):
    what a runtime that refused to serve said, e.g. the int8 precision check's measured agreement."""


def pod_facts(body: Mapping[str, Any]) -> PodFacts:
    """Summarize a Pod object (first container waiting reason wins)."""
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    labels = meta.get("labels") or {}
    ready = False
    ready_since = ""
    unschedulable = ""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
            ready_since = str(cond.get("lastTransitionTime") or "") if ready else ""
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            unschedulable = cond.get("message") or "the scheduler found no fitting node"
    waiting_reason = waiting_message = terminated_message = ""
    restarts = 0
    for cs in status.get("containerStatuses") or []:
        restarts += int(cs.get("restartCount") or 0)
        for state in (cs.get("state"), cs.get("lastState")):
            message = ((state or {}).get("terminated") or {}).get("message") or ""
            if message.strip() and not terminated_message:
                terminated_message = message.strip()
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting.get("reason") != "ContainerCreating" and not waiting_reason:
            waiting_reason, waiting_message = waiting["reason"], waiting.get("message") or ""
    return PodFacts(
        name=meta.get("name", ""),
        revision=labels.get(api.LABEL_REVISION, ""),
        track=labels.get(api.LABEL_TRACK, ""),
        phase=status.get("phase") or "Pending",
        ready=ready,
        node_name=spec.get("nodeName") or "",
        unschedulable_message=unschedulable,
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        restarts=restarts,
        deleting=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
        ready_since=ready_since,
        serving=labels.get(api.LABEL_SERVING, ""),
        deletion_cost=(meta.get("annotations") or {}).get(api.ANNOTATION_DELETION_COST, ""),
        ip=str(status.get("podIP") or ""),
        fallback_digest=text_digest((meta.get("annotations") or {}).get(api.ANNOTATION_FALLBACK)),
        terminated_message=terminated_message,
    )


def text_digest(text: str | None) -> str:
    """A short digest of an annotation's text, '' for none. e.g. None -> ''; "x" -> "2d711642b726b044"."""
    return "" if text is None else hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DeploymentFacts:
    """Rollout state of one Deployment, from its status."""

    name: str
    generation: int
    observed_generation: int
    desired: int
    replicas: int
    ready: int
    available: int
    updated: int
    revision: str
    deadline_exceeded: bool = False

    @property
    def rolled_out(self) -> bool:
        """The controller saw the newest spec and all pods run it and are available."""
        return (
            self.observed_generation >= self.generation
            and self.updated >= self.desired
            and self.replicas <= self.updated
            and self.available >= self.desired
        )


def get_condition(status: Mapping[str, Any] | None, ctype: str) -> Mapping[str, Any] | None:
    """The condition of that type in an object's status, or None."""
    for cond in (status or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def deployment_facts(body: Mapping[str, Any]) -> DeploymentFacts:
    """Summarize a Deployment's status."""
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
    deadline = any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in status.get("conditions") or []
    )
    return DeploymentFacts(
        name=meta.get("name", ""),
        generation=int(meta.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        desired=int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1),
        replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        available=int(status.get("availableReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        revision=(meta.get("labels") or {}).get(api.LABEL_REVISION, ""),
        deadline_exceeded=deadline,
    )


@dataclass(frozen=True)
class Track:
    """One Deployment as observed: its template's revision, replicas asked, pods of that revision."""

    revision: str = ""
    replicas: int = 0
    ready: int = 0
    pods: tuple[PodFacts, ...] = ()
    exists: bool = False

    @property
    def waiting_for_gpus(self) -> bool:
        """A pod of this track cannot be scheduled for lack of GPUs."""
        return any(api.GPU_RESOURCE in p.unschedulable_message for p in self.pods if not p.deleting)


def observe_track(
    body: Mapping[str, Any] | None, pods: Sequence[PodFacts], track: str, revision: str | None = None
) -> Track:
    """Track facts of one Deployment: its template's revision and its Ready pods of that revision.

    Ready counts no more pods than the Deployment asks for: pods beyond spec.replicas are being scaled
    away, even while their deletion has not reached the pod yet (the Deployment and ReplicaSet
    controllers act in turn, seconds apart on a loaded cluster). e.g. the stable Deployment just scaled
    to 0 (a canary at 100 % by replica ratio) with its pod still Ready and not deleting -> 0 Ready: a
    rollback in that pass keeps the canary serving until stable has pods again (make before break),
    where counting that pod took the canary away at once and left the Service nothing Ready.
    """
    if body is None:
        return Track()
    template = (body.get("spec") or {}).get("template") or {}
    rev = ((template.get("metadata") or {}).get("labels") or {}).get(api.LABEL_REVISION, "")
    rev = revision or rev
    mine = tuple(p for p in pods if p.track == track and not p.deleting)
    replicas = (body.get("spec") or {}).get("replicas")
    asked = int(replicas if replicas is not None else 1)
    ready = min(asked, sum(1 for p in mine if p.ready and p.revision == rev))
    return Track(rev, asked, ready, mine, exists=True)


#: Annotations the Deployment controller keeps on a Deployment (its revision counter): not the owner's content.
DEPLOYMENT_CONTROLLER_ANNOTATIONS = frozenset(
    {"deployment.kubernetes.io/revision", "deployment.kubernetes.io/revision-history"}
)


def content_signature(
    body: Mapping[str, Any], spec: bool = True, ignored: frozenset[str] = frozenset()
) -> str:
    """Hash of what a user or the operator sets on an object (not status, not bookkeeping); without the
    spec (`spec=False`) for a kind whose metadata.generation already tells every change of it, and without
    the `ignored` annotations (those a controller other than the operator keeps).

    Two watch events with the same signature need no pass: a status-only update of a PDB or HPA, or the
    echo of the operator's own write.
    """
    meta = body.get("metadata", {})
    essence = {
        "labels": meta.get("labels"),
        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if k not in ignored},
        "ownerReferences": meta.get("ownerReferences"),
    }
    if spec:
        essence |= {k: v for k, v in body.items() if k not in ("metadata", "status", "apiVersion", "kind")}
    return hashlib.sha256(json.dumps(essence, sort_keys=True, default=str).encode()).hexdigest()[:16]


def content_signature_of(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Change signature of most kinds: their content."""
    return (content_signature(body),)


def deployment_signature(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Change signature of a Deployment: its metadata, rollout counts and whether its pods cannot be created
    (ReplicaFailure: e.g. the endpoint picker's ServiceAccount missing, shown in status.routing.picker).

    Its spec is hashed only when it has no metadata.generation (in the counts): the API server moves that
    on every change of a Deployment's spec, and every watch event of every Deployment comes here. The
    Deployment controller's revision annotations are left out: it sets them on every new Deployment.
    """
    failure = (get_condition(body.get("status"), "ReplicaFailure") or {}).get("status")
    spec = not body.get("metadata", {}).get("generation")
    meta = content_signature(body, spec=spec, ignored=DEPLOYMENT_CONTROLLER_ANNOTATIONS)
    return (meta, astuple(deployment_facts(body)), failure)


def deployment_progress_only(before: tuple[Any, ...] | None, after: tuple[Any, ...]) -> bool:
    """Whether a Deployment's new change signature (deployment_signature) differs from `before` only by
    rollout progress short of its goal: counts moving while fewer pods are ready and available than it
    asks for, under the same generation, metadata and failure state.

    e.g. updated 0 -> 1 of 2: True; ready reaching the replicas asked, a new generation, a label, a
    ReplicaFailure, the deadline exceeded, a scale-down (enough pods available): False.
    """
    if before is None or before[0] != after[0] or before[2] != after[2]:
        return False
    was, now = DeploymentFacts(*before[1]), DeploymentFacts(*after[1])
    fixed = ("name", "generation", "desired", "revision", "deadline_exceeded")
    if any(getattr(was, f) != getattr(now, f) for f in fixed):
        return False
    return now.ready < now.desired and now.available < now.desired


def autoscaler_signature(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Change signature of an HPA or ScaledObject: its content and the status and reason of its conditions.

    So a flip of ScalingActive (HPA) or Ready (ScaledObject) triggers a pass that shows it in the
    ChatbotService's status, while the HPA's frequent metric updates trigger nothing.
    """
    conditions = tuple(
        sorted(
            (c.get("type", ""), c.get("status", ""), c.get("reason", ""))
            for c in (body.get("status") or {}).get("conditions") or []
            if c.get("type") in ("ScalingActive", "Ready")
        )
    )
    return (content_signature(body), conditions)


#: Gateway API's group, and the conditions a Gateway controller writes per parentRef of a route that say
#: whether it serves it: Accepted (attached: a listener allows the route, its hostnames match) and
#: ResolvedRefs (every backendRef resolves).
GATEWAY_GROUP = "gateway.networking.k8s.io"
ROUTE_CONDITIONS = ("Accepted", "ResolvedRefs")


@dataclass(frozen=True)
class GatewayCondition:
    """One condition a Gateway wrote on a route; all '' when it wrote none of that type."""

    status: str = ""
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class RouteParent:
    """One Gateway's word on an HTTPRoute (an entry of status.parents): which Gateway, which controller,
    and its Accepted and ResolvedRefs conditions."""

    namespace: str
    """The parent Gateway's namespace (the route's own when the parentRef names none)."""
    name: str
    section: str
    """parentRef.sectionName ('' when the route attaches to every listener)."""
    controller: str
    accepted: GatewayCondition = GatewayCondition()
    resolved_refs: GatewayCondition = GatewayCondition()


def route_parents(body: Mapping[str, Any]) -> tuple[RouteParent, ...]:
    """The Gateways' words on an HTTPRoute, from status.parents (parents of other kinds left out), sorted.

    e.g. status.parents [{parentRef: {name: gw}, controllerName: c, conditions: [Accepted False
    NotAllowedByListeners "no listener"]}] of a route in shop -> (RouteParent("shop", "gw", "", "c",
    accepted=GatewayCondition("False", "NotAllowedByListeners", "no listener")),). No status: ().
    """
    own_namespace = (body.get("metadata") or {}).get("namespace") or ""
    parents = []
    for entry in (body.get("status") or {}).get("parents") or []:
        ref = entry.get("parentRef") or {}
        if (ref.get("group") or GATEWAY_GROUP, ref.get("kind") or "Gateway") != (GATEWAY_GROUP, "Gateway"):
            continue
        found = {
            c.get("type"): GatewayCondition(
                str(c.get("status") or ""), str(c.get("reason") or ""), str(c.get("message") or "")
            )
            for c in entry.get("conditions") or []
            if c.get("type") in ROUTE_CONDITIONS
        }
        parents.append(
            RouteParent(
                namespace=str(ref.get("namespace") or own_namespace),
                name=str(ref.get("name") or ""),
                section=str(ref.get("sectionName") or ""),
                controller=str(entry.get("controllerName") or ""),
                accepted=found.get("Accepted", GatewayCondition()),
                resolved_refs=found.get("ResolvedRefs", GatewayCondition()),
            )
        )
    return tuple(sorted(parents, key=lambda p: (p.namespace, p.name, p.section, p.controller)))


def httproute_signature(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Change signature of an HTTPRoute: its content and, per parent Gateway, the status and reason of its
    Accepted and ResolvedRefs conditions.

    So a Gateway accepting or refusing the route triggers a pass that shows it (condition RouteServed),
    while its rewrites of the same conditions (a new observedGeneration and lastTransitionTime after each
    weight change, or only a new message) trigger nothing.
    """
    parents = tuple(
        (
            p.namespace,
            p.name,
            p.section,
            p.controller,
            (p.accepted.status, p.accepted.reason),
            (p.resolved_refs.status, p.resolved_refs.reason),
        )
        for p in route_parents(body)
    )
    return (content_signature(body), parents)


def pod_signature(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Change signature of a pod: problem signals (unschedulable, a waiting reason, restarts), and with a
    warm pool its serving label and readiness (a standby pod that got Ready may join at once), and the
    digest of its chatfleet.io/fallback annotation (a pod that lost it, or was given another, is passed
    over again).

    Healthy pod progress without a warm pool already shows in the Deployment's counts.
    """
    p = pod_facts(body)
    pool = (p.serving, p.ready) if p.serving else ("", False)
    return (
        bool(p.unschedulable_message),
        p.waiting_reason,
        p.restarts > 0,
        p.ready and p.restarts > 0,
        p.fallback_digest,
        *pool,
    )


def node_signature(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """Change signature of a node: labels, allocatable GPUs, schedulability (not heartbeats)."""
    n = node_facts(body)
    return (tuple(sorted(n.labels.items())), n.allocatable_gpus, n.schedulable)


#: A healthy pod's signature: no problem signal at all.
QUIET_POD = (False, "", False, False, "", "", False)
