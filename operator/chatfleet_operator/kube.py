"""The ONLY module that calls the Kubernetes API (import-linter keeps it so).

It owns server-side apply and 404/409 tolerance, and tells metrics.py of every request (by verb, kind and
status code, with its duration) and every write (the benchmark's counts). Every call is blocking (the kubernetes client is synchronous); the reconciler runs it in a thread pool.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import kubernetes
import orjson
import urllib3
from kubernetes.client import ApiClient, Configuration

from chatfleet_operator import api, metrics
from chatfleet_operator.api import ApiError
from chatfleet_operator.kinds import API_PATHS
from chatfleet_operator.timefmt import rfc3339

log = logging.getLogger(__name__)

#: kind -> (API path prefix, plural) of every kind the operator reads or writes (kinds.py's table).
KINDS: dict[str, tuple[str, str]] = API_PATHS

#: Content type of server-side apply (counted as the APPLY verb, as the API server counts it).
APPLY_PATCH = "application/apply-patch+yaml"
_client: ApiClient | None = None

#: What the client raises when it has no cluster to talk to: no usable kubeconfig, or no answer from the API
#: server (refused, reset, timed out, TLS). The plugin prints unreachable_reason() of these, one line.
UNREACHABLE: tuple[type[Exception], ...] = (kubernetes.config.ConfigException, urllib3.exceptions.HTTPError)


def configure(kubeconfig: str | None = None, pool_size: int = 32, context: str | None = None) -> None:
    """Load credentials once: in-cluster if available (and no context is named), else the kubeconfig
    (KUBECONFIG or ~/.kube/config) at its current context or the one named."""
    global _client
    config = Configuration()
    try:
        if context or kubeconfig:
            raise kubernetes.config.ConfigException("a kubeconfig or context was named")
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=config
        )
    config.connection_pool_maxsize = pool_size
    _client = ApiClient(configuration=config)


def unreachable_reason(exc: Exception) -> str:
    """One line for an UNREACHABLE error: "no answer from https://127.0.0.1:6443: Failed to establish a new
    connection: [Errno 111] Connection refused", or "no cluster configured (...): <the loader's reason>"."""
    if isinstance(exc, kubernetes.config.ConfigException):
        return f"no cluster configured (KUBECONFIG, ~/.kube/config, --kubeconfig, --context): {exc}"
    # MaxRetryError keeps the last attempt's error in .reason; its text ends with the socket's complaint
    reason = str(getattr(exc, "reason", None) or exc).rsplit("): ", 1)[-1]
    host = _client.configuration.host if _client is not None else "the API server"
    return f"no answer from {host}: {reason}"


def _api() -> ApiClient:
    """The shared client, configured on first use."""
    if _client is None:
        configure()
    assert _client is not None
    return _client


def request(
    method: str,
    path: str,
    body: Any = None,
    query: Mapping[str, str] | None = None,
    content_type: str = "application/json",
    accept: str = "application/json",
    *,
    kind: str,
) -> dict[str, Any]:
    """One API request about `kind` (the metrics' label); returns the decoded JSON body (orjson: an applied
    Deployment comes back whole, and Python's `json` takes twice as long) or raises ApiError."""
    client = _api()
    headers = {"Accept": accept, "Content-Type": content_type}
    payload = body
    _, url, headers, _, _ = client.param_serialize(
        method,
        path,
        query_params=list((query or {}).items()),
        header_params=headers,
        auth_settings=["BearerToken"],
    )
    verb = "APPLY" if content_type == APPLY_PATCH else method
    started = time.monotonic()
    code = "error"  # no response at all: refused, reset, timed out
    try:
        response = client.call_api(method, url, header_params=headers, body=payload, _request_timeout=30)
        code = str(response.status)
        data = response.read()
    finally:
        seconds = time.monotonic() - started
        metrics.api_request(verb, kind, code, seconds)
    if not 200 <= response.status < 300:
        raise ApiError(response.status, response.reason or "", data.decode(errors="replace") if data else "")
    return orjson.loads(data) if data else {}


def _count(verb: str, kind: str) -> None:
    """Count one write request."""
    metrics.api_write(verb, kind)


def object_path(kind: str, namespace: str | None, name: str | None = None) -> str:
    """REST path of a namespaced object (or its collection when name is None; in every namespace when
    namespace is None too)."""
    prefix, plural = KINDS[kind]
    if namespace is None:
        if name:
            raise ValueError(f"{kind} {name}: a namespaced object needs a namespace")
        return f"{prefix}/{plural}"
    path = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
    return f"{path}/{quote(name)}" if name else path


def apply(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side apply of an owned object (force: the operator owns the fields it sets).

    The body is sent already encoded by orjson: the client passes bytes through as they are, where it
    would encode a dict with Python's `json` (a Deployment of 8 kB; 3 % of the operator's CPU at 1,000
    ChatbotServices, docs/benchmarks.md). Apply is the one write whose content type allows it (the client
    encodes a JSON content type's body whatever it is given)."""
    meta = manifest["metadata"]
    _count("APPLY", manifest["kind"])
    return request(
        "PATCH",
        object_path(manifest["kind"], meta["namespace"], meta["name"]),
        body=orjson.dumps(manifest),
        query={"fieldManager": api.FIELD_MANAGER, "force": "true"},
        content_type=APPLY_PATCH,
        kind=manifest["kind"],
    )


def delete(kind: str, namespace: str, name: str) -> None:
    """Delete an object; already gone is fine."""
    _count("DELETE", kind)
    try:
        request(
            "DELETE", object_path(kind, namespace, name), body={"propagationPolicy": "Background"}, kind=kind
        )
    except ApiError as exc:
        if exc.status != 404:
            raise


def patch_status(namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
    """JSON merge patch of a ChatbotService's status subresource; None if the object is gone."""
    _count("PATCH", "status")
    try:
        return request(
            "PATCH",
            object_path(api.KIND, namespace, name) + "/status",
            body={"status": patch},
            content_type="application/merge-patch+json",
            kind=f"{api.KIND}/status",
        )
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def seed_replicas(namespace: str, name: str, replicas: int) -> None:
    """Set spec.scaling.replicas of a ChatbotService that has none, so its HPA can read its scale.

    Called only when the pass saw no value; the HPA cannot have written one meanwhile, since its scale
    cannot be read without it.
    """
    _count("PATCH", api.KIND)
    try:
        request(
            "PATCH",
            object_path(api.KIND, namespace, name),
            body={"spec": {"scaling": {"replicas": int(replicas)}}},
            content_type="application/merge-patch+json",
            kind=api.KIND,
        )
    except ApiError as exc:
        if exc.status != 404:
            raise


def label_pod(
    namespace: str, name: str, labels: Mapping[str, str], annotations: Mapping[str, str | None]
) -> None:
    """Merge-patch a pod's labels and annotations (None removes one); a pod already gone is fine.

    The warm pool's serving label and deletion cost (autoscale/warmpool.py plans them).
    """
    _count("PATCH", "Pod")
    try:
        request(
            "PATCH",
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
            body={"metadata": {"labels": dict(labels), "annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
            kind="Pod",
        )
    except ApiError as exc:
        if exc.status != 404:
            raise


def config_map_data(namespace: str, name: str) -> dict[str, str] | None:
    """A ConfigMap's data (None when it does not exist)."""
    body = get("ConfigMap", namespace, name)
    return None if body is None else dict(body.get("data") or {})


def get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """Read one object; None when it does not exist."""
    try:
        return request("GET", object_path(kind, namespace, name), kind=kind)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def post_event(
    involved: Mapping[str, Any], type_: str, reason: str, message: str, now: datetime | None = None
) -> None:
    """Post a core/v1 Event about a ChatbotService (failures are logged, never raised)."""
    meta = involved["metadata"]
    stamp = rfc3339(now or datetime.now(UTC))
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": api.FIELD_MANAGER},
        "reportingComponent": api.FIELD_MANAGER,
        "reportingInstance": api.FIELD_MANAGER,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    _count("POST", "Event")
    try:
        request("POST", object_path("Event", meta["namespace"]), body=event, kind="Event")
    except ApiError as exc:
        log.warning("Failed to post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc)


def serves_group(group: str, version: str = "v1") -> bool:
    """Whether the API server serves an API group version (discovery), e.g. gateway.networking.k8s.io/v1."""
    try:
        request("GET", f"/apis/{group}/{version}", kind="APIResourceList")
        return True
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
