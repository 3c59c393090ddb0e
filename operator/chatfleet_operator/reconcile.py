"""One reconcile pass over one ChatbotService, in numbered steps (blocking; runs in a worker thread).

Data flows one way: observe (watch caches, snapshotted on the event loop) -> plan (pure builders and
planner) -> apply (kube.py, in a worker thread) -> compute status (pure) -> one status write, skipped
when unchanged -> events from the old -> new status difference.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from chatfleet_operator import api, kinds
from chatfleet_operator.api import ApiError
from chatfleet_operator.builders import (
    build_deployment,
    build_hpa,
    build_pdb,
    build_service,
    build_triton_configmap,
    endpoint,
    revision_hash,
)
from chatfleet_operator.builders.tritonconfig import config_hash
from chatfleet_operator.cache import Snapshot, World, resource_version, slim
from chatfleet_operator.converge.changes import Change, diff_children
from chatfleet_operator.converge.diagnose import Problem, diagnose, referenced_secrets
from chatfleet_operator.converge.facts import deployment_facts
from chatfleet_operator.converge.status import (
    Observation,
    compute_status,
    error_message,
    error_status,
    pass_events,
    status_patch,
)
from chatfleet_operator.release.children import scale_selector, template_update_in_place
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import Autoscale, ChatbotServiceSpec, ObjectRef

log = logging.getLogger("chatfleet")


@dataclass
class Outcome:
    """Result of one pass."""

    problems: list[Problem]
    writes: int
    status: dict[str, Any]
    retry: bool = False
    """An apply failed in a way worth retrying (5xx, 429, 409) even without a kopf retry."""
    requeue_after: float | None = None
    """Seconds until a release waits on time (a pause, the next measurement); None: no timed wait."""


def autoscaled_total(
    autoscale: Autoscale,
    declared: int | None,
    old_status: Mapping[str, Any],
    snap: Snapshot,
    name: str,
) -> int:
    """Replicas of an autoscaled ChatbotService: the HPA's decision, clamped to minReplicas..maxReplicas.

    The HPA scales the ChatbotService, so its decision is spec.scaling.replicas. Until it is there (a
    new object, or one from before the HPA scaled the ChatbotService), the last total in
    status.desiredReplicas, else the stable Deployment's replicas, else minReplicas. Never the stable
    Deployment during a release: the release itself shrinks it.
    e.g. min 1, max 6: replicas 4 -> 4; replicas 9 -> 6; absent with status.desiredReplicas 3 -> 3.
    """
    decided = (declared, old_status.get("desiredReplicas"))
    current = (snap.children.get(("Deployment", name)) or {}).get("spec", {})
    value = next((v for v in (*decided, current.get("replicas")) if v is not None), autoscale.min_replicas)
    return max(autoscale.min_replicas, min(autoscale.max_replicas, int(value)))


def desired_children(
    ref: ObjectRef,
    spec: ChatbotServiceSpec,
    revision: str,
    settings: Settings,
    snap: Snapshot,
    old_status: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """(desired manifests, desired replicas) of one ChatbotService at `revision`. Pure."""
    configmap = build_triton_configmap(ref, spec)
    autoscale = spec.scaling.autoscale
    if autoscale is not None:
        desired_replicas = autoscaled_total(
            autoscale,
            spec.scaling.replicas if spec.scaling.replicas_set else None,
            old_status or {},
            snap,
            ref.name,
        )
    else:
        desired_replicas = spec.scaling.replicas
    capacity = spec.rollout.gpu_capacity
    deployment = build_deployment(
        ref,
        spec,
        settings.pod,
        revision=revision,
        config_hash=config_hash(configmap["data"]),
        replicas=desired_replicas,
        in_place=template_update_in_place(capacity, snap.children.get(("Deployment", ref.name)), snap.pods),
    )
    # Order matters at scale: the Service comes last because the API server allocates ClusterIPs one
    # at a time (about 30/s); the pods should not wait behind it.
    desired = [configmap, deployment, build_pdb(ref)]
    if autoscale is not None:
        desired.append(build_hpa(ref, autoscale, settings.hpa_metrics))
    desired.append(build_service(ref))
    return desired, desired_replicas


class Gone(Exception):
    """The namespace is being deleted (or gone): nothing to converge, nothing to retry."""


def _namespace_gone(exc: ApiError) -> bool:
    """403 'being terminated' or 404 on the namespace itself."""
    return (exc.status == 403 and "being terminated" in exc.message) or (
        exc.status == 404 and "namespaces" in exc.message
    )


class Client(Protocol):
    """The API calls a pass makes (kube.py in production, a fake in unit tests)."""

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply; returns the object."""

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete; already gone is fine."""

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the status; None when the object is gone."""

    def secret_exists(self, namespace: str, name: str) -> bool:
        """Whether a Secret exists."""

    def seed_replicas(self, namespace: str, name: str, replicas: int) -> None:
        """Set spec.scaling.replicas of a ChatbotService where it is absent (the HPA's scale)."""

    def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: datetime | None = None
    ) -> None:
        """Post an Event about the object."""


def _apply(
    client: Client, change: Change, world: World, snap: Snapshot, namespace: str
) -> tuple[str, bool] | None:
    """Run one planned write; on refusal return (problem message, worth retrying)."""
    key = (change.kind, change.name)
    try:
        if change.verb == "delete":
            client.delete(change.kind, namespace, change.name)
            world.remember(
                change.kind, namespace, change.name, None, resource_version(snap.children.get(key) or {})
            )
            snap.children.pop(key, None)
            log.info("Deleted %s %s/%s (%s)", change.kind, namespace, change.name, change.why)
            return None
        assert change.manifest is not None
        result = slim(client.apply(change.manifest))
        world.remember(change.kind, namespace, change.name, result, resource_version(result))
        world.changed(change.kind, result)  # so the watch echo of this write triggers no pass
        snap.children[key] = result
        verb = "Created" if change.why == "missing" else "Updated"
        log.info("%s %s %s/%s (%s)", verb, change.kind, namespace, change.name, change.why)
    except ApiError as exc:
        if _namespace_gone(exc):
            raise Gone(namespace) from exc
        if exc.status in (400, 422):
            return f"{change.kind} {change.name} was refused by the API server: {exc.message}", False
        # e.g. 500 "failed to allocate a serviceIP: range is full", 429, 409: shown, and retried.
        log.warning("Failed to apply %s %s/%s: %s", change.kind, namespace, change.name, exc)
        return f"{change.kind} {change.name} could not be applied ({exc.status}): {exc.message}", True
    return None


def _seed_replicas(client: Client, ref: ObjectRef, replicas: int) -> tuple[str, bool] | None:
    """Write the first spec.scaling.replicas of an autoscaled ChatbotService; on refusal (message, retry)."""
    try:
        client.seed_replicas(ref.namespace, ref.name, replicas)
    except ApiError as exc:
        log.warning(
            "Failed to set spec.scaling.replicas of ChatbotService %s/%s: %s", ref.namespace, ref.name, exc
        )
        return (
            f"spec.scaling.replicas could not be set for the autoscaler ({exc.status}): {exc.message}",
            True,
        )
    log.info(
        "Set spec.scaling.replicas=%d of ChatbotService %s/%s for its HPA", replicas, ref.namespace, ref.name
    )
    return None


def reconcile_pass(
    client: Client,
    body: Mapping[str, Any],
    snap: Snapshot,
    world: World,
    settings: Settings,
    now: datetime,
    releases: Releases | None = None,
) -> Outcome:
    """One level-triggered pass over one ChatbotService (blocking; runs in a worker thread)."""
    ref = ObjectRef.from_body(body)
    spec = ChatbotServiceSpec.from_dict(body.get("spec"))
    revision = revision_hash(body.get("spec") or {})
    old_status = body.get("status") or {}

    # 1. Observe what the caches cannot tell: do the referenced Secrets exist?
    missing = [name for name in referenced_secrets(spec) if not client.secret_exists(ref.namespace, name)]

    # 2. Plan: desired children vs observed ones; a release (measured when due) rewrites what it moves.
    desired, desired_replicas = desired_children(ref, spec, revision, settings, snap, old_status)
    releases = releases or Releases()
    release = releases.run(
        ref,
        spec,
        desired,
        snap.children,
        snap.pods,
        old_status,
        update_revision=revision,
        total=desired_replicas,
        now=now,
    )
    changes = diff_children(release.desired, snap.children, kinds.DELETABLE)

    # 3. Apply: only what differs. An invalid object is a problem for the user, not a crash.
    refused = [r for change in changes if (r := _apply(client, change, world, snap, ref.namespace))]
    seed = spec.scaling.autoscale is not None and not spec.scaling.replicas_set
    if seed:  # the HPA reads and writes spec.scaling.replicas (the scale subresource): it must exist
        refused += [r for r in [_seed_replicas(client, ref, desired_replicas)] if r]

    # 4. Compute the whole new status (pure) from the freshest view of the Deployment.
    dep_body = snap.children.get(("Deployment", ref.name))
    dep = deployment_facts(dep_body) if dep_body is not None else None
    stable_pods = [p for p in snap.pods if p.track == api.TRACK_STABLE]
    problems = diagnose(spec, snap.nodes, stable_pods, dep, missing)  # canary pods: the release judges them
    problems += [Problem(api.Reason.APPLY_FAILED, msg) for msg, _ in refused]
    problems += [
        Problem(api.Reason.INVALID_ANALYSIS_TARGET, msg) for msg in releases.target_errors(ref, spec)
    ]
    obs = Observation(
        generation=ref.generation,
        revision=release.serving_revision,
        desired_replicas=desired_replicas,
        gpus_per_replica=spec.resources.gpus_per_replica,
        endpoint=endpoint(ref, settings.runtime.cluster_domain),
        selector=scale_selector(ref, spec, release.plan),
        deployment=dep,
        pods=stable_pods,
        problems=problems,
    )
    new_status = compute_status(old_status, obs, now, release.plan.status_fields(revision))

    # 5. One status write, only when something changed; then events from the difference.
    patch = status_patch(old_status, new_status)
    writes = len(changes) + int(seed)
    written = client.patch_status(ref.namespace, ref.name, patch) if patch else None
    if written:
        world.remember(api.KIND, ref.namespace, ref.name, slim(written), resource_version(written))
    if patch and written is not None:
        writes += 1
        ready = next(c for c in new_status["conditions"] if c["type"] == api.COND_READY)
        log.info(
            "Updated status of ChatbotService %s/%s: phase=%s ready=%s (%s)",
            ref.namespace,
            ref.name,
            new_status["phase"],
            ready["status"],
            ready["reason"],
        )
    for event in pass_events(old_status, new_status, release.plan.events):
        client.post_event(body, event.type, event.reason, event.message, now)
        log.info(
            "Posted %s event %s on ChatbotService %s/%s", event.type, event.reason, ref.namespace, ref.name
        )
    return Outcome(
        problems=problems,
        writes=writes,
        status=new_status,
        retry=any(t for _, t in refused),
        requeue_after=release.plan.requeue_after,
    )


class PassFailed(Exception):
    """A pass raised; its error is already in the status (ReconcileError) and in one Warning event."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error_message(error))
        self.error = error


def record_error(
    client: Client, body: Mapping[str, Any], world: World, error: BaseException, now: datetime
) -> None:
    """After a pass raised: write Ready=False/Stalled=True (ReconcileError) once, and one Warning event."""
    ref = ObjectRef.from_body(body)
    old_status = body.get("status") or {}
    new_status = error_status(old_status, ref.generation, error_message(error), now)
    patch = status_patch(old_status, new_status)
    written = client.patch_status(ref.namespace, ref.name, patch) if patch else None
    if written:
        world.remember(api.KIND, ref.namespace, ref.name, slim(written), resource_version(written))
    if patch and written is None:
        return  # the object is gone
    for event in pass_events(old_status, new_status):
        client.post_event(body, event.type, event.reason, event.message, now)
        log.info(
            "Posted %s event %s on ChatbotService %s/%s", event.type, event.reason, ref.namespace, ref.name
        )
