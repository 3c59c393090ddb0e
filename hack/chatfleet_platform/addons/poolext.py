"""InferencePool backends for Envoy Gateway: the extension server that programs them.

Envoy Gateway does not know the InferencePool kind; upstream's answer is an add-on (Envoy AI Gateway) that
is not served here, so this module is the local platform's own. Envoy Gateway is told (its
`extensionManager`) that InferencePools are backend resources handled by this server, and calls it after
each translation (the `Translation` post hook) with every cluster, listener and route configuration. The
server then does what an Inference Extension gateway does for a rule whose backends are InferencePools:

- the rule's route sends each pool its HTTPRoute weight (a weighted cluster per pool: Envoy Gateway makes
  one endpoint-less cluster of a rule's custom backends, so their weights would be lost);
- each pool's cluster is ORIGINAL_DST on `x-gateway-destination-endpoint`, the header its picker sets;
- the listener's HTTP filters gain ext_proc before the router; each weighted cluster asks its own pool's
  picker (the pool's `endpointPickerRef`, reached at its Service's ClusterIP); other routes of that
  listener turn ext_proc off;
- each InferencePool it programmed gets `Accepted` and `ResolvedRefs` in `status.parents` for the Gateways
  its route is attached to (Envoy Gateway writes the HTTPRoute's; a pool's is the pool implementation's).

Every pool is programmed fail-closed (a picker that does not answer fails the request): the operator's
pools ask for FailClose; FailOpen, which needs the gateway's own balancing over a pool's endpoints, is not
implemented here.

Who calls it: Envoy Gateway only (127.0.0.1). It reads HTTPRoutes, InferencePools and Services and writes
InferencePool status, through kubectl with the kubeconfig it is given.

`program` is the pure part (request in, response out, given the rules' pools); `serve` is the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import betterproto2

# The types of what this module builds, registered for their Any fields:
import envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3
import envoy_data_plane.envoy.extensions.upstreams.http.v3  # noqa: F401
import grpclib.const
import grpclib.server
from envoy_data_plane.envoy.config.cluster.v3 import Cluster
from envoy_data_plane.envoy.config.core.v3 import HeaderValue, HeaderValueOption
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import (
    Route,
    RouteConfiguration,
    WeightedCluster,
    WeightedClusterClusterWeight,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import Secret
from envoy_data_plane.google.protobuf import Any as AnyMessage
from pydantic.dataclasses import dataclass as message

from chatfleet_platform.addons.poolgateway import (
    EXT_PROC,
    EXT_PROC_ROUTE_TYPE,
    UPSTREAM_HEADER,
    ext_proc_filter,
    ext_proc_override,
    picker_cluster,
    pool_cluster,
)

log = logging.getLogger("chatfleet.poolext")

HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
POOL_GROUP = "inference.networking.k8s.io"
ANY_ADDRESS = ("0.0.0.0", "::")
#: Envoy Gateway's name for the clusters of an HTTPRoute rule's backends: httproute/<ns>/<name>/rule/<i>.
RULE_CLUSTER = re.compile(r"^httproute/(?P<ns>[^/]+)/(?P<name>[^/]+)/rule/(?P<rule>\d+)(?:/|$)")


# --- The extension's messages (Envoy Gateway's proto/extension, the post-translate call only) -------------
_CONFIG = {"extra": "forbid"}


@message(eq=False, repr=False, config=_CONFIG)
class ExtensionResource(betterproto2.Message):
    unstructured_bytes: bytes = betterproto2.field(1, betterproto2.TYPE_BYTES)


@message(eq=False, repr=False, config=_CONFIG)
class PostTranslateExtensionContext(betterproto2.Message):
    extension_resources: list[ExtensionResource] = betterproto2.field(
        1, betterproto2.TYPE_MESSAGE, repeated=True
    )


@message(eq=False, repr=False, config=_CONFIG)
class PostTranslateModifyRequest(betterproto2.Message):
    post_translate_context: PostTranslateExtensionContext | None = betterproto2.field(
        1, betterproto2.TYPE_MESSAGE, optional=True
    )
    clusters: list[Cluster] = betterproto2.field(2, betterproto2.TYPE_MESSAGE, repeated=True)
    secrets: list[Secret] = betterproto2.field(3, betterproto2.TYPE_MESSAGE, repeated=True)
    listeners: list[Listener] = betterproto2.field(4, betterproto2.TYPE_MESSAGE, repeated=True)
    routes: list[RouteConfiguration] = betterproto2.field(5, betterproto2.TYPE_MESSAGE, repeated=True)


@message(eq=False, repr=False, config=_CONFIG)
class PostTranslateModifyResponse(betterproto2.Message):
    clusters: list[Cluster] = betterproto2.field(1, betterproto2.TYPE_MESSAGE, repeated=True)
    secrets: list[Secret] = betterproto2.field(2, betterproto2.TYPE_MESSAGE, repeated=True)
    listeners: list[Listener] = betterproto2.field(3, betterproto2.TYPE_MESSAGE, repeated=True)
    routes: list[RouteConfiguration] = betterproto2.field(4, betterproto2.TYPE_MESSAGE, repeated=True)


SERVICE = "/envoygateway.extension.EnvoyGatewayExtension"


# --- What to program (pure) ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolBackend:
    """One InferencePool backend of an HTTPRoute rule: its weight and where its picker answers."""

    namespace: str
    name: str
    weight: int
    picker_host: str
    picker_port: int

    @property
    def cluster(self) -> str:
        return pool_cluster_name(self.namespace, self.name)

    @property
    def picker(self) -> str:
        return f"{self.cluster}/picker"


def pool_cluster_name(namespace: str, name: str) -> str:
    """The Envoy cluster the extension makes of an InferencePool."""
    return f"inferencepool/{namespace}/{name}"


def is_pool_rule(rule: Mapping[str, Any]) -> bool:
    """Whether an HTTPRoute rule's backends are all InferencePools (the rules this extension programs)."""
    refs = rule.get("backendRefs") or []
    return bool(refs) and all(
        r.get("kind") == "InferencePool" and r.get("group", POOL_GROUP) == POOL_GROUP for r in refs
    )


def rule_of(cluster_name: str) -> tuple[str, str, int] | None:
    """(namespace, route name, rule index) of an Envoy Gateway rule cluster's name, else None."""
    m = RULE_CLUSTER.match(cluster_name)
    return (m["ns"], m["name"], int(m["rule"])) if m else None


def _route_clusters(route: Route) -> list[str]:
    action = route.route
    if action is None:
        return []
    if action.weighted_clusters is not None:
        return [c.name for c in action.weighted_clusters.clusters]
    return [action.cluster] if action.cluster else []


def _rule_key(route: Route) -> tuple[str, str, int] | None:
    for name in _route_clusters(route):
        key = rule_of(name)
        if key:
            return key
    return None


def _hcm_filters(listener: Listener) -> list[Filter]:
    chains: list[FilterChain] = list(listener.filter_chains)
    if listener.default_filter_chain is not None:
        chains.append(listener.default_filter_chain)
    return [
        f for chain in chains for f in chain.filters if f.typed_config and f.typed_config.type_url == HCM_TYPE
    ]


def _with_ext_proc(hcm: HttpConnectionManager, picker: str) -> bool:
    """Put ext_proc before the router of `hcm` (once); True when it changed."""
    if any(f.name == EXT_PROC for f in hcm.http_filters):
        return False
    at = next(
        (
            i
            for i, f in enumerate(hcm.http_filters)
            if f.typed_config and f.typed_config.type_url == ROUTER_TYPE
        ),
        len(hcm.http_filters),
    )
    hcm.http_filters.insert(at, HttpFilter.from_dict(ext_proc_filter(picker)))
    return True


def program(
    request: PostTranslateModifyRequest,
    rules: Mapping[tuple[str, str, int], Sequence[PoolBackend]],
    *,
    identify_upstream: bool = False,
    listen_on: str | None = None,
) -> tuple[PostTranslateModifyResponse, list[PoolBackend]]:
    """Envoy Gateway's translation with the InferencePool rules programmed, and the pools programmed.

    `rules` maps an HTTPRoute rule (namespace, name, index) whose backends are InferencePools to those
    pools; a rule not in it (a Service backend, or a pool not found) is left as Envoy Gateway made it.
    `identify_upstream` adds the response header naming the replica (tests and benchmarks); `listen_on`
    puts the listeners Envoy Gateway binds on every interface on that address instead (the local
    platform's 127.0.0.1)."""
    clusters = list(request.clusters)
    names = {c.name for c in clusters}
    programmed: dict[str, PoolBackend] = {}
    served_configs: dict[str, str] = {}  # route configuration -> a picker cluster (the filter's default)
    for config in request.routes:
        pool_routes, other_routes = [], []
        for vhost in config.virtual_hosts:
            for route in vhost.routes:
                key = _rule_key(route)
                (pool_routes if key in rules else other_routes).append((route, key))
        if not pool_routes:
            continue
        for route, key in pool_routes:
            backends = rules[key]
            action = route.route
            assert action is not None
            action.cluster = None
            action.weighted_clusters = WeightedCluster(
                clusters=[
                    WeightedClusterClusterWeight(
                        name=b.cluster,
                        weight=b.weight,
                        typed_per_filter_config={EXT_PROC: AnyMessage.from_dict(ext_proc_override(b.picker))},
                    )
                    for b in backends
                ]
            )
            if identify_upstream:
                route.response_headers_to_add.append(
                    HeaderValueOption(header=HeaderValue(key=UPSTREAM_HEADER, value="%UPSTREAM_HOST%"))
                )
            for b in backends:
                programmed[b.cluster] = b
        off = AnyMessage.from_dict({"@type": EXT_PROC_ROUTE_TYPE, "disabled": True})
        for route, _ in other_routes:
            route.typed_per_filter_config[EXT_PROC] = off
        served_configs[config.name] = next(iter(programmed.values())).picker
    for b in programmed.values():
        for built in (pool_cluster(b.cluster), picker_cluster(b.picker, b.picker_host, b.picker_port)):
            if built["name"] not in names:
                clusters.append(Cluster.from_dict(built))
                names.add(built["name"])
    for listener in request.listeners:
        sock = listener.address.socket_address if listener.address else None
        if listen_on and sock is not None and sock.address in ANY_ADDRESS:
            sock.address = listen_on
        for f in _hcm_filters(listener):
            hcm = f.typed_config.unpack()
            if not isinstance(hcm, HttpConnectionManager) or hcm.rds is None:
                continue
            picker = served_configs.get(hcm.rds.route_config_name)
            if picker and _with_ext_proc(hcm, picker):
                f.typed_config = AnyMessage.pack(hcm)
    response = PostTranslateModifyResponse(
        clusters=clusters,
        secrets=list(request.secrets),
        listeners=list(request.listeners),
        routes=list(request.routes),
    )
    return response, list(programmed.values())


def rules_from(
    objects: Sequence[Mapping[str, Any]], keys: Sequence[tuple[str, str, int]]
) -> dict[tuple[str, str, int], list[PoolBackend]]:
    """The InferencePool rules among `keys`, read from the namespaces' HTTPRoutes, InferencePools and
    Services (`objects`). A rule is left out while a pool, its picker Service or that Service's ClusterIP is
    missing (the gateway keeps Envoy Gateway's own translation of it until the next one)."""
    by = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
    out: dict[tuple[str, str, int], list[PoolBackend]] = {}
    for ns, name, index in keys:
        route = by.get(("HTTPRoute", ns, name))
        rules = (route or {}).get("spec", {}).get("rules") or []
        if index >= len(rules):
            continue
        if not is_pool_rule(rules[index]):
            continue
        backends = []
        for ref in rules[index]["backendRefs"]:
            pns = ref.get("namespace", ns)
            pool = by.get(("InferencePool", pns, ref["name"]))
            picker = (pool or {}).get("spec", {}).get("endpointPickerRef") or {}
            host = picker_host((by.get(("Service", pns, picker.get("name", ""))) or {}).get("spec") or {})
            if not pool or not host:
                break
            port = int(picker["port"]["number"])
            backends.append(PoolBackend(pns, ref["name"], int(ref.get("weight", 1)), host, port))
        else:
            out[(ns, name, index)] = backends
    return out


def picker_host(service: Mapping[str, Any]) -> str | None:
    """Where a picker Service's spec answers: its ClusterIP, or an ExternalName's name (a picker outside the
    cluster, e.g. a process on this host); None while it has neither (or is headless)."""
    if service.get("type") == "ExternalName":
        return service.get("externalName") or None
    ip = service.get("clusterIP")
    return ip if ip and ip != "None" else None


def parents_of(route: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The Gateways (namespace, name) an HTTPRoute names as parents."""
    ns = route["metadata"]["namespace"]
    return [
        (p.get("namespace", ns), p["name"])
        for p in route.get("spec", {}).get("parentRefs") or []
        if p.get("kind", "Gateway") == "Gateway"
    ]


def pool_status(parents: Sequence[tuple[str, str]], generation: int, now: str) -> dict[str, Any]:
    """An InferencePool's status: each Gateway accepts it and resolves its references."""
    conditions = [
        {
            "type": kind,
            "status": "True",
            "reason": kind,
            "message": "programmed by the Chatfleet pool extension of Envoy Gateway",
            "observedGeneration": generation,
            "lastTransitionTime": now,
        }
        for kind in ("Accepted", "ResolvedRefs")
    ]
    return {
        "parents": [
            {
                "parentRef": {
                    "group": "gateway.networking.k8s.io",
                    "kind": "Gateway",
                    "namespace": ns,
                    "name": name,
                },
                "conditions": conditions,
            }
            for ns, name in parents
        ]
    }


# --- The server --------------------------------------------------------------------------------------------
class Kubectl:
    """The API as this server needs it: read a namespace's routes, pools and Services; write pool status."""

    def __init__(self, kubectl: str, kubeconfig: str) -> None:
        self.argv = [kubectl, "--kubeconfig", kubeconfig]

    def objects(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for ns in sorted(set(namespaces)):
            res = subprocess.run(
                [*self.argv, "-n", ns, "get", "httproutes,inferencepools,services", "-o", "json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if res.returncode != 0:
                raise RuntimeError(f"reading namespace {ns}: {res.stderr.strip()}")
            items += json.loads(res.stdout).get("items", [])
        return items

    def write_pool_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        subprocess.run(
            [
                *self.argv,
                "-n",
                namespace,
                "patch",
                "inferencepools",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": status}),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )


class PoolExtension:
    """Envoy Gateway's extension service: the post-translate hook only (the one this gateway asks for)."""

    def __init__(
        self,
        api: Kubectl,
        *,
        identify_upstream: bool = False,
        listen_on: str | None = None,
        programs_log: Path | None = None,
    ) -> None:
        self.api, self.identify_upstream, self.listen_on = api, identify_upstream, listen_on
        self.programs_log = programs_log
        self._written: dict[tuple[str, str], tuple[int, tuple[tuple[str, str], ...]]] = {}

    def translate(self, request: PostTranslateModifyRequest) -> PostTranslateModifyResponse:
        keys = sorted(
            {
                k
                for config in request.routes
                for v in config.virtual_hosts
                for r in v.routes
                if (k := _rule_key(r))
            }
        )
        objects = self.api.objects([ns for ns, _, _ in keys]) if keys else []
        rules = rules_from(objects, keys)
        response, programmed = program(
            request, rules, identify_upstream=self.identify_upstream, listen_on=self.listen_on
        )
        log.info(
            "translation: %d routes, rules %s, %d of them over pools, %d pools programmed; %d objects read",
            sum(len(v.routes) for c in request.routes for v in c.virtual_hosts),
            ["/".join(map(str, k)) for k in keys],
            len(rules),
            len(programmed),
            len(objects),
        )
        self._write_status(objects, rules, programmed)
        if self.programs_log and programmed:
            line = {"time": time.time(), "weights": {b.name: b.weight for b in programmed}}
            with self.programs_log.open("a") as out:
                out.write(json.dumps(line) + "\n")
        return response

    def _write_status(
        self,
        objects: Sequence[Mapping[str, Any]],
        rules: Mapping[tuple[str, str, int], Sequence[PoolBackend]],
        programmed: Sequence[PoolBackend],
    ) -> None:
        by = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
        parents: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for (ns, name, _), backends in rules.items():
            for b in backends:
                parents.setdefault((b.namespace, b.name), set()).update(
                    parents_of(by[("HTTPRoute", ns, name)])
                )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for b in programmed:
            key = (b.namespace, b.name)
            generation = int(by[("InferencePool", *key)]["metadata"].get("generation", 1))
            mark = (generation, tuple(sorted(parents.get(key, ()))))
            if self._written.get(key) != mark:
                self.api.write_pool_status(*key, pool_status(mark[1], generation, now))
                self._written[key] = mark

    async def post_translate_modify(self, stream: grpclib.server.Stream) -> None:
        request = await stream.recv_message()
        try:
            response = await asyncio.to_thread(self.translate, request)
        except Exception as exc:  # Envoy Gateway keeps the last good config and logs this
            log.exception("translation failed")
            raise grpclib.GRPCError(grpclib.const.Status.INTERNAL, f"pool extension: {exc}") from exc
        await stream.send_message(response)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            f"{SERVICE}/PostTranslateModify": grpclib.const.Handler(
                self.post_translate_modify,
                grpclib.const.Cardinality.UNARY_UNARY,
                PostTranslateModifyRequest,
                PostTranslateModifyResponse,
            )
        }


async def serve(extension: PoolExtension, host: str, port: int) -> None:
    server = grpclib.server.Server([extension])
    await server.start(host, port)
    log.info("pool extension on %s:%d", host, port)
    await server.wait_closed()


def main(argv: Sequence[str] | None = None, run: Callable[..., Any] = asyncio.run) -> None:
    parser = argparse.ArgumentParser(prog="python -m chatfleet_platform.addons.poolext", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument(
        "--identify-upstream", action="store_true", help="name the replica in a response header"
    )
    parser.add_argument("--listen-on", help="bind the listeners Envoy Gateway puts on 0.0.0.0 here instead")
    parser.add_argument("--programs-log", type=Path, help="append each translation's pool weights here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    extension = PoolExtension(
        Kubectl(args.kubectl, args.kubeconfig),
        identify_upstream=args.identify_upstream,
        listen_on=args.listen_on,
        programs_log=args.programs_log,
    )
    run(serve(extension, args.host, args.port))


if __name__ == "__main__":
    main()
