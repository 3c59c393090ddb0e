"""How a pass writes: each planned change through the API client, refusals sorted into problems.

reconcile.py plans; the functions here carry out one pass's writes through `Client` (kube.py in
production, a fake in unit tests) and say, for each refusal, the message the status shows and whether it
is worth retrying. They remember what they wrote in the watch caches' World, so the watch echo of a
write triggers no pass. A namespace being deleted ends the pass (`Gone`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from chatfleet_operator import api
from chatfleet_operator.api import ApiError
from chatfleet_operator.autoscale.warmpool import PodLabel
from chatfleet_operator.cache import Snapshot, World, resource_version, slim
from chatfleet_operator.converge.changes import Change
from chatfleet_operator.converge.fallback import PodAnnotation
from chatfleet_operator.spec import ObjectRef

log = logging.getLogger("chatfleet")


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

    def seed_replicas(self, namespace: str, name: str, replicas: int) -> None:
        """Set spec.scaling.replicas of a ChatbotService where it is absent (the HPA's scale)."""

    def label_pod(
        self, namespace: str, name: str, labels: Mapping[str, str], annotations: Mapping[str, str | None]
    ) -> None:
        """Merge-patch a pod's labels and annotations (None removes one)."""

    def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: datetime | None = None
    ) -> None:
        """Post an Event about the object."""


def apply_change(
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


def seed_replicas(client: Client, ref: ObjectRef, replicas: int) -> tuple[str, bool] | None:
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


def patch_pods(
    client: Client,
    ref: ObjectRef,
    patches: list[tuple[str, dict[str, str], dict[str, str | None]]],
    what: str,
) -> tuple[str, bool] | None:
    """Merge-patch each (pod, labels, annotations) in turn (None removes an annotation); on the first
    refusal (message, worth retrying). `what` says what the patches do, e.g. "labelled"."""
    for name, labels, notes in patches:
        try:
            client.label_pod(ref.namespace, name, labels, notes)
        except ApiError as exc:
            log.warning("Failed to patch pod %s/%s (%s): %s", ref.namespace, name, what, exc)
            return f"pod {name} could not be {what} ({exc.status}): {exc.message}", True
        log.info("Pod %s/%s %s: %s %s", ref.namespace, name, what, labels, sorted(notes))
    return None


def label_pods(client: Client, ref: ObjectRef, labels: list[PodLabel]) -> tuple[str, bool] | None:
    """Flip the warm pool's serving labels and deletion costs."""
    patches = [
        (c.name, {api.LABEL_SERVING: c.serving}, {api.ANNOTATION_DELETION_COST: c.deletion_cost})
        for c in labels
    ]
    return patch_pods(client, ref, patches, "labelled")


def annotate_pods(client: Client, ref: ObjectRef, changes: list[PodAnnotation]) -> tuple[str, bool] | None:
    """Write spec.fallback into each pod's chatfleet.io/fallback annotation (None removes it)."""
    patches = [(c.name, {}, {api.ANNOTATION_FALLBACK: c.value}) for c in changes]
    return patch_pods(client, ref, patches, "annotated")


def write_status(
    client: Client, world: World, ref: ObjectRef, patch: Mapping[str, Any], now: datetime
) -> dict[str, Any] | None:
    """The pass's one status write when `patch` is not empty, remembered in the world; the written
    object, or None (nothing to write, or the object is gone)."""
    written = client.patch_status(ref.namespace, ref.name, patch) if patch else None
    if written:
        world.remember(api.KIND, ref.namespace, ref.name, slim(written), resource_version(written))
        world.status_written((ref.namespace, ref.name), now)
    return written


def post_events(client: Client, body: Mapping[str, Any], ref: ObjectRef, events, now: datetime) -> None:
    """Post the events of a pass's status difference."""
    for event in events:
        client.post_event(body, event.type, event.reason, event.message, now)
        log.info(
            "Posted %s event %s on ChatbotService %s/%s", event.type, event.reason, ref.namespace, ref.name
        )
