"""Orchestration of one reconcile pass, and the per-object controller that serializes passes.

Data flows one way: observe (watch caches, snapshotted on the event loop) -> plan (pure builders and
planner) -> apply (kube.py, in a worker thread) -> compute status (pure) -> one status write, skipped
when unchanged -> events from the old -> new status difference.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import kopf

from chatfleet_operator import api
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
from chatfleet_operator.builders.release import GATEWAY_GROUP
from chatfleet_operator.builders.tritonconfig import config_hash
from chatfleet_operator.release_pass import Releases, merge_events
from chatfleet_operator.rollout.diagnose import Problem, diagnose, referenced_secrets
from chatfleet_operator.rollout.facts import (
    QUIET_POD,
    NodeFacts,
    PodFacts,
    change_signature,
    deployment_facts,
)
from chatfleet_operator.rollout.plan import Action, plan_children
from chatfleet_operator.rollout.release import ReleaseOptions
from chatfleet_operator.rollout.status import (
    Observation,
    compute_status,
    derive_phase,
    error_message,
    error_status,
    status_events,
    status_patch,
)
from chatfleet_operator.rollout.tracks import release_status, scale_selector, template_update_in_place
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import Autoscale, ChatbotServiceSpec, ObjectRef

log = logging.getLogger("chatfleet")

Key = tuple[str, str]  # (namespace, ChatbotService name)

#: Owned kinds the planner may delete when no longer desired (the HPA when autoscaling is turned off).
DELETABLE_KINDS = ("HorizontalPodAutoscaler",)
#: Problems a new or relabelled node can solve (node events retry these ChatbotServices at once).
PLACEMENT_REASONS = frozenset({api.Reason.NO_MATCHING_GPU_NODES, api.Reason.INSUFFICIENT_GPUS})
#: Index names registered in main.py, by child kind.
CHILD_INDEXES = {
    "ConfigMap": "configmap_index",
    "Deployment": "deployment_index",
    "Service": "service_index",
    "HorizontalPodAutoscaler": "hpa_index",
    "PodDisruptionBudget": "pdb_index",
}


def trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """Keep what comparison and facts need from a watched object (drops managedFields to save memory)."""
    meta = dict(body.get("metadata", {}))
    meta.pop("managedFields", None)
    out = {k: v for k, v in body.items() if k not in ("metadata",)}
    out["metadata"] = meta
    return dict(out)


def owner_key(namespace: str | None, labels: Mapping[str, str]) -> Key | None:
    """(namespace, owner) of an owned object from its chatfleet.io/service label."""
    owner = labels.get(api.LABEL_SERVICE)
    return (namespace, owner) if namespace and owner else None


def _rv(body: Mapping[str, Any]) -> int:
    """resourceVersion as an int for ordering (opaque by contract, numeric with etcd)."""
    value = str(body.get("metadata", {}).get("resourceVersion", "0"))
    return int(value) if value.isdigit() else 0


@dataclass
class Snapshot:
    """What one pass observes: owned objects by (kind, name), pods, nodes. Taken on the event loop."""

    children: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    pods: list[PodFacts] = field(default_factory=list)
    nodes: list[NodeFacts] = field(default_factory=list)


class World:
    """The watch caches (kopf indexes) plus the objects this process has just written."""

    def __init__(self) -> None:
        self.indexes: Mapping[str, Any] = {}
        self._recent: dict[tuple[str, str, str], tuple[int, Mapping[str, Any] | None]] = {}
        self._signatures: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._lock = threading.Lock()

    def changed(self, kind: str, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """Record an object's change signature; True when it differs from the last one seen or written."""
        meta = body.get("metadata", {})
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            if deleted:
                before = self._signatures.pop(key, None)
                return kind != "Pod" or (before is not None and before != QUIET_POD)
            signature = change_signature(kind, body)
            before = self._signatures.get(key, QUIET_POD if kind == "Pod" else None)
            self._signatures[key] = signature
        return signature != before

    def remember(self, kind: str, namespace: str, name: str, body: Mapping[str, Any] | None, rv: int) -> None:
        """Record an object we wrote (or a tombstone), newer than the watch cache until its event arrives."""
        with self._lock:
            self._recent[(kind, namespace, name)] = (rv, body)

    def forget(self, namespace: str, owner: str) -> None:
        """Drop remembered writes of one owner (when it is deleted)."""
        names = (owner, f"{owner}-triton", f"{owner}-{api.TRACK_CANARY}", f"{owner}-{api.TRACK_PREVIEW}")
        with self._lock:
            for kind in (*CHILD_INDEXES, api.KIND):
                for name in names:
                    self._recent.pop((kind, namespace, name), None)

    def _store(self, index: str, key: Any) -> list[Any]:
        """Values of one index key (empty when unknown)."""
        idx = self.indexes.get(index)
        if idx is None or key not in idx:
            return []
        return list(idx[key])

    def body(self, key: Key, given: Mapping[str, Any] | None = None) -> Mapping[str, Any] | None:
        """The freshest ChatbotService body: the watch cache, the handler's, or our last status write."""
        values = self._store("cbs_index", key)
        candidates = [b for b in (values[0] if values else None, given) if b is not None]
        if not candidates:
            return None  # deleted (or never seen)
        with self._lock:
            _, written = self._recent.get((api.KIND, *key), (0, None))
        if written is not None:
            candidates.append(written)
        return max(candidates, key=_rv)

    def snapshot(self, key: Key) -> Snapshot:
        """Copy what a pass needs out of the indexes (call on the event loop thread)."""
        snap = Snapshot()
        for kind, index in CHILD_INDEXES.items():
            for body in self._store(index, key):
                snap.children[(kind, body["metadata"]["name"])] = body
        namespace, owner = key
        candidates = (owner, f"{owner}-triton", f"{owner}-{api.TRACK_CANARY}", f"{owner}-{api.TRACK_PREVIEW}")
        with self._lock:
            for kind in CHILD_INDEXES:
                for name in candidates:
                    entry = self._recent.get((kind, namespace, name))
                    if entry is None:
                        continue
                    rv, written = entry
                    current = snap.children.get((kind, name))
                    if written is None:  # a tombstone: hide the deleted object until the cache drops it
                        if current is not None and _rv(current) <= rv:
                            del snap.children[(kind, name)]
                        else:
                            del self._recent[(kind, namespace, name)]
                    elif current is not None and _rv(current) >= rv:
                        del self._recent[(kind, namespace, name)]  # the cache caught up
                    else:
                        snap.children[(kind, name)] = written
        snap.pods = self._store("pod_index", key)
        snap.nodes = self._store("node_index", "nodes")
        return snap


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
    raw_spec: Mapping[str, Any],
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
    decided = ((raw_spec.get("scaling") or {}).get("replicas"), old_status.get("desiredReplicas"))
    current = (snap.children.get(("Deployment", name)) or {}).get("spec", {})
    value = next((v for v in (*decided, current.get("replicas")) if v is not None), autoscale.min_replicas)
    return max(autoscale.min_replicas, min(autoscale.max_replicas, int(value)))


def desired_children(
    ref: ObjectRef,
    spec: ChatbotServiceSpec,
    raw_spec: Mapping[str, Any],
    settings: Settings,
    snap: Snapshot,
    old_status: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], str, int]:
    """(desired manifests, revision, desired replicas) of one ChatbotService. Pure."""
    revision = revision_hash(raw_spec)
    configmap = build_triton_configmap(ref, spec)
    autoscale = spec.scaling.autoscale
    if autoscale is not None:
        desired_replicas = autoscaled_total(autoscale, raw_spec, old_status or {}, snap, ref.name)
    else:
        desired_replicas = spec.scaling.replicas
    capacity = ReleaseOptions.from_dict(raw_spec.get("rollout")).gpu_capacity
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
    return desired, revision, desired_replicas


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
    client: Client, action: Action, world: World, snap: Snapshot, namespace: str
) -> tuple[str, bool] | None:
    """Run one planned write; on refusal return (problem message, worth retrying)."""
    key = (action.kind, action.name)
    try:
        if action.verb == "delete":
            client.delete(action.kind, namespace, action.name)
            world.remember(action.kind, namespace, action.name, None, _rv(snap.children.get(key) or {}))
            snap.children.pop(key, None)
            log.info("Deleted %s %s/%s (%s)", action.kind, namespace, action.name, action.why)
            return None
        assert action.manifest is not None
        result = trim(client.apply(action.manifest))
        world.remember(action.kind, namespace, action.name, result, _rv(result))
        world.changed(action.kind, result)  # so the watch echo of this write triggers no pass
        snap.children[key] = result
        verb = "Created" if action.why == "missing" else "Updated"
        log.info("%s %s %s/%s (%s)", verb, action.kind, namespace, action.name, action.why)
    except ApiError as exc:
        if _namespace_gone(exc):
            raise Gone(namespace) from exc
        if exc.status in (400, 422):
            return f"{action.kind} {action.name} was refused by the API server: {exc.message}", False
        # e.g. 500 "failed to allocate a serviceIP: range is full", 429, 409: shown, and retried.
        log.warning("Failed to apply %s %s/%s: %s", action.kind, namespace, action.name, exc)
        return f"{action.kind} {action.name} could not be applied ({exc.status}): {exc.message}", True
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
    raw_spec = body.get("spec") or {}
    spec = ChatbotServiceSpec.from_dict(raw_spec)
    old_status = body.get("status") or {}

    # 1. Observe what the caches cannot tell: do the referenced Secrets exist?
    missing = [name for name in referenced_secrets(spec) if not client.secret_exists(ref.namespace, name)]

    # 2. Plan: desired children vs observed ones; a release (measured when due) rewrites what it moves.
    desired, revision, desired_replicas = desired_children(ref, spec, raw_spec, settings, snap, old_status)
    releases = releases or Releases()
    release = releases.run(
        ref,
        spec,
        raw_spec,
        desired,
        snap.children,
        snap.pods,
        old_status,
        update_revision=revision,
        total=desired_replicas,
        now=now,
    )
    actions = plan_children(release.desired, snap.children, DELETABLE_KINDS)

    # 3. Apply: only what differs. An invalid object is a problem for the user, not a crash.
    refused = [r for action in actions if (r := _apply(client, action, world, snap, ref.namespace))]
    seed = spec.scaling.autoscale is not None and (raw_spec.get("scaling") or {}).get("replicas") is None
    if seed:  # the HPA reads and writes spec.scaling.replicas (the scale subresource): it must exist
        refused += [r for r in [_seed_replicas(client, ref, desired_replicas)] if r]

    # 4. Compute the whole new status (pure) from the freshest view of the Deployment.
    dep_body = snap.children.get(("Deployment", ref.name))
    dep = deployment_facts(dep_body) if dep_body is not None else None
    stable_pods = [p for p in snap.pods if p.track == api.TRACK_STABLE]
    problems = diagnose(spec, snap.nodes, stable_pods, dep, missing)  # canary pods: the release judges them
    problems += [Problem(api.Reason.APPLY_FAILED, msg) for msg, _ in refused]
    problems += [
        Problem(api.Reason.INVALID_ANALYSIS_TARGET, msg)
        for msg in releases.target_errors(ref, spec, raw_spec)
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
    new_status = release_status(
        compute_status(old_status, obs, now), old_status, release, ref.generation, revision, now
    )
    new_status["phase"] = derive_phase(new_status)

    # 5. One status write, only when something changed; then events from the difference.
    patch = status_patch(old_status, new_status)
    writes = len(actions) + int(seed)
    written = client.patch_status(ref.namespace, ref.name, patch) if patch else None
    if written:
        world.remember(api.KIND, ref.namespace, ref.name, trim(written), _rv(written))
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
    for event in merge_events(status_events(old_status, new_status), release.plan.events):
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
        world.remember(api.KIND, ref.namespace, ref.name, trim(written), _rv(written))
    if patch and written is None:
        return  # the object is gone
    for event in status_events(old_status, new_status):
        client.post_event(body, event.type, event.reason, event.message, now)
        log.info(
            "Posted %s event %s on ChatbotService %s/%s", event.type, event.reason, ref.namespace, ref.name
        )


def backoff_delay(retry: int, base: float, ceiling: float) -> float:
    """Growing retry delay: base * 2**retry, capped; e.g. base 5: 5, 10, 20, 40, ... 300."""
    return float(min(ceiling, base * (2 ** min(retry, 16))))


class Controller:
    """Serializes passes per ChatbotService and coalesces bursts of watch events into one pass."""

    def __init__(
        self, settings: Settings, client: Client, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.settings = settings
        self.client = client
        self.world = World()
        serves = getattr(client, "serves_group", None)
        self.releases = Releases(
            settings.release,
            serves_gateway_api=(lambda: serves(GATEWAY_GROUP)) if serves else None,
            cluster_domain=settings.runtime.cluster_domain,
        )
        self.clock = clock
        self.executor = ThreadPoolExecutor(
            max_workers=settings.runtime.workers, thread_name_prefix="reconcile"
        )
        # Triggered passes (mostly status updates) get their own threads, so a burst of creations does not
        # hold back the Ready of the ChatbotServices created first.
        self.trigger_executor = ThreadPoolExecutor(
            max_workers=max(4, settings.runtime.workers // 2), thread_name_prefix="triggered"
        )
        self._locks: dict[Key, asyncio.Lock] = {}
        self._pending: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._waiting_for_nodes: set[Key] = set()
        self.passes = 0
        self.latencies: list[float] = []

    def use_indexes(self, indexes: Mapping[str, Any]) -> None:
        """Keep references to kopf's index objects (they live as long as the operator)."""
        if not self.world.indexes:
            self.world.indexes = {k: v for k, v in indexes.items() if k.endswith("_index")}

    async def run_pass(
        self, key: Key, body: Mapping[str, Any] | None = None, executor: ThreadPoolExecutor | None = None
    ) -> Outcome | None:
        """Run one pass for `key` under its lock, on the freshest cached body."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            body = self.world.body(key, body)
            if body is None or body.get("metadata", {}).get("deletionTimestamp"):
                return None
            snap = self.world.snapshot(key)
            loop = asyncio.get_running_loop()
            try:
                outcome, seconds = await loop.run_in_executor(
                    executor or self.executor, self._timed_pass, body, snap
                )
            except Gone:
                log.info("Skipped ChatbotService %s/%s: its namespace is being deleted", *key)
                return None
            self.passes += 1
            if outcome.requeue_after:  # a release waits on time (a pause, the next measurement)
                loop.call_later(outcome.requeue_after, self.trigger, key)
            self.latencies.append(seconds)
            if any(p.reason in PLACEMENT_REASONS for p in outcome.problems):
                self._waiting_for_nodes.add(key)
            else:
                self._waiting_for_nodes.discard(key)
            if len(self.latencies) > 100_000:
                del self.latencies[:50_000]
            return outcome

    def _timed_pass(self, body: Mapping[str, Any], snap: Snapshot) -> tuple[Outcome, float]:
        """One pass in a worker thread, with its duration (seconds); a pass that raises -> PassFailed."""
        started = time.monotonic()
        try:
            outcome = reconcile_pass(
                self.client, body, snap, self.world, self.settings, self.clock(), self.releases
            )
        except Gone:
            raise
        except Exception as exc:
            meta = body.get("metadata", {})
            log.exception("Failed to reconcile ChatbotService %s/%s", meta.get("namespace"), meta.get("name"))
            try:
                record_error(self.client, body, self.world, exc, self.clock())
            except Exception as record_exc:  # e.g. the API server is down: the retry will tell again
                log.warning("Failed to record the error in the status: %s", record_exc)
            raise PassFailed(exc) from exc
        return outcome, time.monotonic() - started

    def child_event(self, kind: str, event_type: str, body: Mapping[str, Any], key: Key | None) -> None:
        """A watch event of an owned object or pod: trigger the owner only when something that matters changed."""
        if key is not None and self.world.changed(kind, body, deleted=event_type == "DELETED"):
            self.trigger(key)

    async def handle(self, body: Mapping[str, Any], retry: int) -> None:
        """kopf handler body: one pass; unsatisfiable or raised -> kopf.TemporaryError with a growing delay."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        delay = backoff_delay(retry, self.settings.retry.base_delay, self.settings.retry.max_delay)
        try:
            outcome = await self.run_pass(key, body)
        except PassFailed as exc:
            raise kopf.TemporaryError(
                f"Reconcile failed: {exc}; retrying in {delay:.0f}s", delay=delay
            ) from exc
        if outcome is not None and outcome.problems:
            reasons = ", ".join(sorted({p.reason for p in outcome.problems}))
            raise kopf.TemporaryError(
                f"Waiting for {reasons} to be resolved; retrying in {delay:.0f}s", delay=delay
            )

    def trigger(self, key: Key | None) -> None:
        """Ask for a pass soon (debounced); repeated asks before it runs are merged."""
        if key is None or key in self._pending:
            return
        self._pending.add(key)
        loop = asyncio.get_running_loop()
        loop.call_later(self.settings.retry.trigger_debounce, lambda: loop.create_task(self._triggered(key)))

    async def _triggered(self, key: Key) -> None:
        """A triggered pass; API failures retry with backoff (kopf handlers retry their own)."""
        self._pending.discard(key)
        try:
            outcome = await self.run_pass(key, executor=self.trigger_executor)
        except Exception as exc:
            outcome, error = None, exc
        else:
            error = None
            if outcome is None or not outcome.retry:
                self._failures.pop(key, None)
                return
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = backoff_delay(failures - 1, 1.0, self.settings.retry.max_delay)
        why = error or "; ".join(p.message for p in outcome.problems if p.reason == api.Reason.APPLY_FAILED)
        log.warning("Failed to reconcile ChatbotService %s/%s (retry in %.0fs): %s", *key, delay, why)
        asyncio.get_running_loop().call_later(delay, self.trigger, key)

    def node_event(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A node appeared, changed labels or GPUs: retry at once the ChatbotServices waiting for one."""
        if self.world.changed("Node", body, deleted=event_type == "DELETED"):
            for key in list(self._waiting_for_nodes):
                self.trigger(key)

    def forget(self, key: Key) -> None:
        """Drop per-object state once a ChatbotService is deleted."""
        self._waiting_for_nodes.discard(key)
        self._locks.pop(key, None)
        self._failures.pop(key, None)
        self.world.forget(*key)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, e.g. percentile([1, 2, 3, 4], 0.5) == 2."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def stats(controller: Controller) -> dict[str, Any]:
    """Pass count and latency percentiles (seconds) of one operator process."""
    return {
        "passes": controller.passes,
        "latency_p50_s": percentile(controller.latencies, 0.5),
        "latency_p99_s": percentile(controller.latencies, 0.99),
    }
