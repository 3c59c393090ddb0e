"""The replicas of one ChatbotService as the picker knows them: pods from the API, load from their metrics.

Pure parts (`endpoint_of_pod`, `parse_load`, `Fleet`, `route_split`) are tested alone; `watch_pods` (the
Kubernetes API, in a thread) and `scrape` (each replica's metrics port) feed a `Fleet`, `watch_route` (a
thread) keeps the bot's HTTPRoute's weights and pinning rules in a `LatestRoute`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from chatfleet_picker.choose import Endpoint

log = logging.getLogger("chatfleet.picker")

#: Pod labels the operator sets (chatfleet_operator.api; kept apart so the picker needs no operator code).
LABEL_TRACK = "chatfleet.io/track"
LABEL_REVISION = "chatfleet.io/revision"
LABEL_SERVING = "chatfleet.io/serving"
#: The runtime's metrics the load is read from.
INFLIGHT = "chatfleet_inflight_requests"
KV_BYTES, KV_CAPACITY = "chatfleet_model_prefix_cache_bytes", "chatfleet_model_prefix_cache_capacity_bytes"


@dataclass(frozen=True)
class Replica:
    endpoint: Endpoint
    metrics_url: str


def endpoint_of_pod(pod: Mapping[str, Any], target_port: int, metrics_port: int) -> Replica | None:
    """The replica a pod is, or None while it has no IP. Ready: the Ready condition is True, the pod is
    not being deleted, and it is not a warm-pool standby (chatfleet.io/serving=false)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ip = status.get("podIP")
    if not ip:
        return None
    labels = meta.get("labels") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    ready = (
        conditions.get("Ready") == "True"
        and not meta.get("deletionTimestamp")
        and labels.get(LABEL_SERVING, "true") != "false"
    )
    endpoint = Endpoint(
        address=f"{ip}:{target_port}",
        revision=labels.get(LABEL_REVISION, ""),
        track=labels.get(LABEL_TRACK, ""),
        ready=ready,
    )
    return Replica(endpoint, f"http://{ip}:{metrics_port}/metrics")


def parse_load(text: str) -> tuple[float, float]:
    """(queue, KV usage) from a Prometheus text exposition: the sum of chatfleet_inflight_requests, and
    the prefix cache's bytes over its capacity (0 when either is missing).

    >>> parse_load('chatfleet_inflight_requests{model="m"} 3.0\\nchatfleet_model_prefix_cache_bytes 50\\n'
    ...            'chatfleet_model_prefix_cache_capacity_bytes 200\\n')
    (3.0, 0.25)
    """
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in (INFLIGHT, KV_BYTES, KV_CAPACITY):
            try:
                sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    capacity = sums.get(KV_CAPACITY, 0.0)
    kv = min(1.0, sums.get(KV_BYTES, 0.0) / capacity) if capacity > 0 else 0.0
    return sums.get(INFLIGHT, 0.0), kv


class Fleet:
    """The replicas by key (the pod's uid; the address for a fixed list): pods replace the set, metrics
    update the load in place. Thread-safe (the pod watch runs in a thread of its own)."""

    def __init__(self, replicas: Iterable[Replica] = ()) -> None:
        self._lock = threading.Lock()
        self._by_pod: dict[str, Replica] = {}
        for r in replicas:
            self._by_pod[r.endpoint.address] = r

    def endpoints(self) -> list[Endpoint]:
        with self._lock:
            return [r.endpoint for r in self._by_pod.values()]

    def replicas(self) -> list[Replica]:
        with self._lock:
            return list(self._by_pod.values())

    def put_pod(self, uid: str, replica: Replica | None) -> None:
        """A pod was added or changed (None: it has no IP yet, so it is not a replica)."""
        with self._lock:
            old = self._by_pod.get(uid)
            if replica is None:
                self._by_pod.pop(uid, None)
                return
            if old is not None and old.endpoint.address == replica.endpoint.address:
                keep = old.endpoint
                load = replace(replica.endpoint, queue=keep.queue, kv_usage=keep.kv_usage)
                replica = replace(replica, endpoint=load)
            self._by_pod[uid] = replica

    def uids(self) -> set[str]:
        with self._lock:
            return set(self._by_pod)

    def drop_pod(self, uid: str) -> None:
        with self._lock:
            self._by_pod.pop(uid, None)

    def set_load(self, address: str, queue: float, kv_usage: float) -> None:
        with self._lock:
            for key, r in self._by_pod.items():
                if r.endpoint.address == address:
                    self._by_pod[key] = replace(
                        r, endpoint=replace(r.endpoint, queue=queue, kv_usage=kv_usage)
                    )


async def scrape(
    fleet: Fleet, observed: Callable[[list[str], list[str]], None], interval_s: float, timeout_s: float = 1.0
) -> None:
    """Every `interval_s`, read each replica's metrics; `observed(read, present)` after each round: the
    addresses read, and every replica's. A replica that does not answer keeps its last load (the pod watch
    says whether it is Ready)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def one(r: Replica) -> str | None:
            try:
                async with session.get(r.metrics_url) as resp:
                    queue, kv = parse_load(await resp.text())
            except (TimeoutError, aiohttp.ClientError):
                return None
            fleet.set_load(r.endpoint.address, queue, kv)
            return r.endpoint.address

        while True:
            replicas = fleet.replicas()
            done = await asyncio.gather(*(one(r) for r in replicas))
            observed([a for a in done if a], [r.endpoint.address for r in replicas])
            await asyncio.sleep(interval_s)


def load_kube_config() -> None:
    """The API's credentials: in-cluster (the picker's ServiceAccount), else the kubeconfig outside a
    cluster."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def watch_pods(fleet: Fleet, namespace: str, selector: str, target_port: int, metrics_port: int) -> None:
    """List then watch the pods matching `selector`, forever (run in a thread). In-cluster credentials,
    or the kubeconfig outside a cluster. A broken watch lists again."""
    from kubernetes import client, watch

    load_kube_config()
    api = client.ApiClient()
    core = client.CoreV1Api(api)
    while True:
        try:
            listed = core.list_namespaced_pod(namespace, label_selector=selector)
            seen = set()
            for pod in listed.items:
                d = api.sanitize_for_serialization(pod)
                seen.add(d["metadata"]["uid"])
                fleet.put_pod(d["metadata"]["uid"], endpoint_of_pod(d, target_port, metrics_port))
            for uid in fleet.uids() - seen:
                fleet.drop_pod(uid)
            for event in watch.Watch().stream(
                core.list_namespaced_pod,
                namespace,
                label_selector=selector,
                resource_version=listed.metadata.resource_version,
                timeout_seconds=300,
            ):
                pod = api.sanitize_for_serialization(event["object"])
                uid = pod["metadata"]["uid"]
                if event["type"] == "DELETED":
                    fleet.drop_pod(uid)
                else:
                    fleet.put_pod(uid, endpoint_of_pod(pod, target_port, metrics_port))
        except Exception as exc:  # the API server restarting must not end the picker
            log.warning("pod watch of %s/%s broke (%s); listing again", namespace, selector, exc)
            threading.Event().wait(1.0)


POOL_GROUP, POOL_KIND = "inference.networking.k8s.io", "InferencePool"


@dataclass(frozen=True)
class RouteSplit:
    """What the picker reads of its bot's HTTPRoute: the weights by track of the rule that splits the
    traffic among the pools, and the header matches of the rules that pin a pool (a request matching one
    came to its pool by that rule, not by the weights)."""

    weights: dict[str, int] | None
    pins: tuple[tuple[tuple[str, str], ...], ...] = ()
    """Each: (lower-cased header name, value) pairs that must all be present (exact matches)."""

    def pinned(self, headers: Mapping[str, str]) -> bool:
        """Whether a request with these headers (names lower-cased) matches a pinning rule."""
        return any(all(headers.get(name) == value for name, value in pin) for pin in self.pins)


def route_split(route: Mapping[str, Any], pools: Mapping[str, str]) -> RouteSplit:
    """The RouteSplit of an HTTPRoute (`pools`: pool name -> track).

    The weights are those of its first rule that matches on no header with every backend one of `pools`
    (a backend without a weight weighs 1, Gateway API's default); None when no rule does (the gateway's
    own choice then stands). The pins are the header matches of the other rules whose backends are pools.

    e.g. rules [x-chatfleet-revision: a -> bot], [bot 80, bot-canary 20] with pools {bot: stable,
    bot-canary: canary} -> weights {stable: 80, canary: 20}, pins ((("x-chatfleet-revision", "a"),),).
    """
    weights: dict[str, int] | None = None
    pins: list[tuple[tuple[str, str], ...]] = []
    for rule in (route.get("spec") or {}).get("rules") or []:
        refs = rule.get("backendRefs") or []
        if not refs or not all(
            r.get("group") == POOL_GROUP and r.get("kind") == POOL_KIND and r.get("name") in pools
            for r in refs
        ):
            continue
        matches = rule.get("matches") or []
        headed = [m for m in matches if m.get("headers")]
        if headed:
            for m in headed:
                pins.append(tuple((h["name"].lower(), h["value"]) for h in m["headers"]))
            continue
        if weights is None:
            weights = {}
            for r in refs:
                track = pools[r["name"]]
                weights[track] = weights.get(track, 0) + int(r.get("weight", 1))
    return RouteSplit(weights, tuple(pins))


#: The longest wait between two reads of a route that cannot be read (1 s, doubling up to this).
ROUTE_RETRY_MAX_S = 30.0


class LatestRoute:
    """The route as last read (None: not read, or unreadable); written by the route watch's thread, read
    on the event loop (one attribute: a plain swap)."""

    def __init__(self) -> None:
        self.current: RouteSplit | None = None


def watch_route(holder: LatestRoute, namespace: str, name: str, pools: Mapping[str, str]) -> None:
    """Watch the HTTPRoute `name`, forever (run in a thread), keeping `holder` at its split; a route
    deleted or unreadable leaves None (new dialogues then take the gateway's choice)."""
    from kubernetes import client, watch

    load_kube_config()
    api = client.CustomObjectsApi()
    args = ("gateway.networking.k8s.io", "v1", namespace, "httproutes")
    selector = f"metadata.name={name}"
    backoff = 1.0
    while True:
        try:
            listed = api.list_namespaced_custom_object(*args, field_selector=selector)
            backoff = 1.0
            items = listed.get("items") or []
            holder.current = route_split(items[0], pools) if items else None
            for event in watch.Watch().stream(
                api.list_namespaced_custom_object,
                *args,
                field_selector=selector,
                resource_version=listed["metadata"]["resourceVersion"],
                timeout_seconds=300,
            ):
                deleted = event["type"] == "DELETED"
                holder.current = None if deleted else route_split(event["object"], pools)
        except Exception as exc:  # the API server restarting (or a Role without httproutes) must not end it
            holder.current = None
            log.warning(
                "route watch of %s/%s broke (%s); listing again in %.0fs", namespace, name, exc, backoff
            )
            threading.Event().wait(backoff)
            backoff = min(ROUTE_RETRY_MAX_S, backoff * 2)
