"""Names, labels, owner references and hashes shared by every builder."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.spec import ObjectRef

#: Spec parts whose change makes a new revision. Scaling, rollout and analysis do not.
REVISION_FIELDS = ("model", "runtime", "resources", "podMetadata")


def stable_json(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces) so equal content always hashes the same."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(value: Any, length: int = 10) -> str:
    """Short sha256 hex digest of a JSON-able value, e.g. short_hash({}) == '44136fa355'."""
    return hashlib.sha256(stable_json(value).encode()).hexdigest()[:length]


def revision_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a spec that make its revision, those present. e.g. {model, scaling} -> {model}."""
    return {key: spec[key] for key in REVISION_FIELDS if key in spec}


def revision_hash(spec: Mapping[str, Any]) -> str:
    """Revision of a spec: hash of model, runtime, resources and podMetadata (not scaling/rollout)."""
    return short_hash({key: spec.get(key) for key in REVISION_FIELDS})


def desired_hash(manifest: Mapping[str, Any]) -> str:
    """Hash of a desired manifest, without the hash annotation itself."""
    meta = dict(manifest.get("metadata", {}))
    annotations = {k: v for k, v in meta.get("annotations", {}).items() if k != api.ANNOTATION_DESIRED_HASH}
    meta["annotations"] = annotations
    return short_hash({**manifest, "metadata": meta}, 16)


def with_desired_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    """Return the manifest with its desired-hash annotation set."""
    digest = desired_hash(manifest)
    manifest.setdefault("metadata", {}).setdefault("annotations", {})[api.ANNOTATION_DESIRED_HASH] = digest
    return manifest


def deployment_name(ref: ObjectRef, track: str = api.TRACK_STABLE) -> str:
    """Deployment name per track: the stable one carries the ChatbotService's name."""
    return ref.name if track == api.TRACK_STABLE else f"{ref.name}-{track}"


def service_name(ref: ObjectRef) -> str:
    """Service name: the ChatbotService's name."""
    return ref.name


def endpoint(ref: ObjectRef, cluster_domain: str = "cluster.local") -> str:
    """OpenAI-compatible chat endpoint inside the cluster."""
    return f"http://{service_name(ref)}.{ref.namespace}.svc.{cluster_domain}:8080"


def common_labels(ref: ObjectRef) -> dict[str, str]:
    """Labels on every owned object."""
    return {
        api.LABEL_NAME: api.NAME_VALUE,
        api.LABEL_INSTANCE: ref.name,
        api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE,
        api.LABEL_SERVICE: ref.name,
    }


def helper_pod_labels(ref: ObjectRef, app: str, component: str) -> dict[str, str]:
    """Labels of the pods the operator runs beside a fleet (the endpoint picker, the stream relay): no
    chatfleet.io/service label, so no Service, PDB, pool or autoscaler of the fleet selects them."""
    return {
        api.LABEL_NAME: app,
        api.LABEL_INSTANCE: ref.name,
        api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE,
        api.LABEL_COMPONENT: component,
    }


def selector_labels(ref: ObjectRef, track: str = api.TRACK_STABLE) -> dict[str, str]:
    """Immutable pod selector of one track."""
    return {api.LABEL_SERVICE: ref.name, api.LABEL_TRACK: track}


def owner_reference(ref: ObjectRef) -> dict[str, Any]:
    """Controller owner reference to the ChatbotService (garbage collection deletes the children)."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(ref: ObjectRef, name: str, extra_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """metadata of an owned object."""
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": {**common_labels(ref), **(extra_labels or {})},
        "ownerReferences": [owner_reference(ref)],
    }


def seconds_quantity(milliseconds: int) -> str:
    """Milliseconds as a canonical Kubernetes quantity of seconds: 50 -> '50m', 2000 -> '2'."""
    return str(milliseconds // 1000) if milliseconds % 1000 == 0 else f"{milliseconds}m"
