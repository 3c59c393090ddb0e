"""Why a valid spec cannot be satisfied, from cluster facts. Pure: facts in, problems out."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from chatfleet_operator import api
from chatfleet_operator.api import Reason
from chatfleet_operator.converge.facts import IMAGE_PULL_REASONS, DeploymentFacts, NodeFacts, PodFacts
from chatfleet_operator.spec import ChatbotServiceSpec


@dataclass(frozen=True)
class Problem:
    """One reason the ChatbotService cannot become Ready without the user acting."""

    reason: str
    message: str


def referenced_secrets(spec: ChatbotServiceSpec) -> dict[str, str]:
    """Secret name -> the spec field naming it (only Secrets the pods cannot start without)."""
    refs: dict[str, str] = {}
    if spec.runtime.sessions.redis is not None:
        refs[spec.runtime.sessions.redis.secret_name] = "spec.runtime.sessions.redis.secretName"
    if spec.model.credentials_secret:
        refs[spec.model.credentials_secret] = "spec.model.credentialsSecret"
    return refs


#: The kubelet's CreateContainerConfigError messages about a Secret an env var or envFrom names:
#: 'secret "redis" not found', and "couldn't find key url in Secret team-a/redis".
SECRET_MISSING = re.compile(r'secret "(?P<name>[^"]+)" not found')
SECRET_KEY_MISSING = re.compile(r"couldn't find key (?P<key>\S+) in Secret (?:[^/\s]+/)?(?P<name>\S+)")


def missing_secret(pod: PodFacts) -> tuple[str, str] | None:
    """(Secret name, missing key or '') a pod's CreateContainerConfigError names; None for any other state.

    The operator never reads Secrets: the kubelet tells which one is missing when it starts the pod.
    e.g. 'secret "r" not found' -> ('r', ''); "couldn't find key url in Secret ns/r" -> ('r', 'url').
    """
    if pod.deleting or pod.waiting_reason != "CreateContainerConfigError":
        return None
    if found := SECRET_MISSING.search(pod.waiting_message):
        return found["name"], ""
    if found := SECRET_KEY_MISSING.search(pod.waiting_message):
        return found["name"], found["key"]
    return None


def secret_problems(spec: ChatbotServiceSpec, pods: Iterable[PodFacts]) -> list[Problem]:
    """One problem per missing Secret (or key) the pods report, naming the spec field that names it.

    e.g. pod p-1 waiting 'secret "r" not found', spec.runtime.sessions.redis.secretName r -> SecretNotFound
    "Secret 'r' named by spec.runtime.sessions.redis.secretName does not exist (pod p-1)".
    """
    refs = referenced_secrets(spec)
    first: dict[tuple[str, str], str] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        if (missing := missing_secret(pod)) is not None:
            first.setdefault(missing, pod.name)
    problems = []
    for (name, key), pod_name in sorted(first.items()):
        field = refs.get(name, "the spec")
        if not key:
            problems.append(
                Problem(
                    Reason.SECRET_NOT_FOUND,
                    f"Secret {name!r} named by {field} does not exist (pod {pod_name})",
                )
            )
            continue
        if field == "spec.runtime.sessions.redis.secretName":
            field += " (key: spec.runtime.sessions.redis.key)"
        problems.append(
            Problem(
                Reason.SECRET_KEY_NOT_FOUND,
                f"Secret {name!r} named by {field} has no key {key!r} (pod {pod_name})",
            )
        )
    return problems


#: How the runtime's int8 check starts its termination message
#: (chatfleet_runtime.engine.calibration.FAILURE_PREFIX; the operator does not import the runtime, so the
#: words are repeated here and tested against it).
PRECISION_CHECK_PREFIX = "precision check failed:"


def precision_problems(spec: ChatbotServiceSpec, pods: Iterable[PodFacts]) -> list[Problem]:
    """PrecisionCheckFailed for the first pod whose runtime refused to serve int8, with its own words.

    e.g. pod p-1 terminated 'precision check failed: int8 agreement 0.930 < 0.980 (...)' ->
    PrecisionCheckFailed "Pod p-1: int8 agreement 0.930 < 0.980 (...) (spec.runtime.precision int8,
    spec.runtime.calibration.minAgreement 0.98)".
    """
    for pod in sorted(pods, key=lambda p: p.name):
        text = pod.terminated_message
        if pod.deleting or not text.startswith(PRECISION_CHECK_PREFIX):
            continue
        detail = text[len(PRECISION_CHECK_PREFIX) :].strip()
        where = (
            f"spec.runtime.precision {spec.runtime.precision}, "
            f"spec.runtime.calibration.minAgreement {spec.runtime.calibration.min_agreement:g}"
        )
        return [Problem(Reason.PRECISION_CHECK_FAILED, f"Pod {pod.name}: {detail} ({where})")]
    return []


class NodeCatalog(Sequence[NodeFacts]):
    """The cluster's nodes as placement reads them, summarised once per change of their facts.

    A pass asks for the most GPUs one matching node offers; the answer is kept per selector, so a pass
    costs the same on 10 nodes or 5,000 (scanning 1,600 nodes took about a millisecond, every pass). The
    watch cache builds a new catalog when a node's labels, GPUs or schedulability change (`World`), not on
    heartbeats. Read by pass threads at once: an answer computed twice is the same answer."""

    def __init__(self, nodes: Iterable[NodeFacts] = ()) -> None:
        self._nodes = tuple(nodes)
        self._largest: dict[tuple[tuple[str, str], ...], int | None] = {}
        self._products: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, index: int) -> NodeFacts: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[NodeFacts]: ...
    def __getitem__(self, index: int | slice) -> NodeFacts | Sequence[NodeFacts]:
        return self._nodes[index]

    def largest(self, selector: Mapping[str, str]) -> int | None:
        """Most allocatable GPUs on one schedulable node whose labels match `selector`; None: no node does."""
        key = tuple(sorted(selector.items()))
        if key not in self._largest:
            counts = [
                n.allocatable_gpus
                for n in self._nodes
                if n.schedulable and all(n.labels.get(k) == v for k, v in key)
            ]
            self._largest[key] = max(counts) if counts else None
        return self._largest[key]

    def products(self) -> tuple[str, ...]:
        """The GPU products the nodes have, sorted."""
        if self._products is None:
            self._products = tuple(sorted({n.gpu_product for n in self._nodes if n.gpu_product}))
        return self._products


def placement_problems(spec: ChatbotServiceSpec, nodes: Iterable[NodeFacts]) -> list[Problem]:
    """No schedulable node with the node selector's labels and GPU product, or none with enough allocatable
    GPUs for one replica."""
    catalog = nodes if isinstance(nodes, NodeCatalog) else NodeCatalog(nodes)
    res = spec.resources
    selector: dict[str, str] = dict(res.node_selector)
    if res.gpu_product:
        selector[api.GPU_PRODUCT_LABEL] = res.gpu_product
    largest = catalog.largest(selector)
    if largest is None:
        known = ", ".join(catalog.products()) or "none"
        if res.gpu_product:
            what = f"{api.GPU_PRODUCT_LABEL}={res.gpu_product} (spec.resources.gpuProduct)"
        else:
            what = "the labels of spec.resources.nodeSelector"
        return [
            Problem(
                Reason.NO_MATCHING_GPU_NODES, f"No schedulable node has {what}; GPU products present: {known}"
            )
        ]
    if res.gpus_per_replica > largest:
        return [
            Problem(
                Reason.INSUFFICIENT_GPUS,
                f"spec.resources.gpusPerReplica={res.gpus_per_replica} exceeds the largest matching node "
                f"({largest} allocatable {api.GPU_RESOURCE})",
            )
        ]
    return []


def pod_problems(
    spec: ChatbotServiceSpec, pods: Iterable[PodFacts], deployment: DeploymentFacts | None
) -> list[Problem]:
    """Image pull failures, config errors, unschedulable pods, and a passed progress deadline."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.deleting:
            continue
        if pod.waiting_reason in IMAGE_PULL_REASONS and Reason.IMAGE_PULL_FAILED not in seen:
            seen.add(Reason.IMAGE_PULL_FAILED)
            detail = f": {pod.waiting_message}" if pod.waiting_message else ""
            # A missing imagePullSecret shows here: the kubelet pulls without it, and a private registry refuses.
            pull_secrets = spec.runtime.image_pull_secrets
            creds = f"; check spec.runtime.imagePullSecrets {list(pull_secrets)}" if pull_secrets else ""
            problems.append(
                Problem(
                    Reason.IMAGE_PULL_FAILED,
                    f"Image {spec.runtime.image!r} (spec.runtime.image) cannot be pulled "
                    f"({pod.waiting_reason}){detail}{creds}",
                )
            )
        elif missing_secret(pod) is not None:
            continue  # secret_problems reports it, naming the Secret and the spec field
        elif (
            pod.waiting_reason == "CreateContainerConfigError"
            and Reason.CREATE_CONTAINER_CONFIG_ERROR not in seen
        ):
            seen.add(Reason.CREATE_CONTAINER_CONFIG_ERROR)
            problems.append(
                Problem(Reason.CREATE_CONTAINER_CONFIG_ERROR, f"Pod {pod.name}: {pod.waiting_message}")
            )
        elif pod.unschedulable_message and Reason.UNSCHEDULABLE not in seen:
            seen.add(Reason.UNSCHEDULABLE)
            problems.append(
                Problem(
                    Reason.UNSCHEDULABLE, f"Pod {pod.name} cannot be scheduled: {pod.unschedulable_message}"
                )
            )
    if deployment is not None and deployment.deadline_exceeded and not deployment.rolled_out:
        problems.append(
            Problem(
                Reason.PROGRESS_DEADLINE_EXCEEDED,
                f"Deployment {deployment.name} made no progress within spec.analysis.progressDeadlineSeconds="
                f"{spec.analysis.progress_deadline_seconds}s ({deployment.available}/{deployment.desired} available)",
            )
        )
    return problems


def diagnose(
    spec: ChatbotServiceSpec,
    nodes: Iterable[NodeFacts],
    pods: Iterable[PodFacts],
    deployment: DeploymentFacts | None,
) -> list[Problem]:
    """All problems, most fundamental first (placement, secrets, then pods)."""
    pods = list(pods)
    return [
        *placement_problems(spec, nodes),
        *secret_problems(spec, pods),
        *precision_problems(spec, pods),
        *pod_problems(spec, pods, deployment),
    ]


def crashlooping(pods: Iterable[PodFacts], revision: str) -> list[PodFacts]:
    """Pods of `revision` that restart and are not ready (CrashLoopBackOff or restarting)."""
    return [
        p
        for p in pods
        if not p.deleting
        and p.revision == revision
        and not p.ready
        and (p.waiting_reason == "CrashLoopBackOff" or p.restarts > 0)
    ]
