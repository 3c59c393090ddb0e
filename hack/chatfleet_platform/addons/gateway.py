"""Traefik on the local platform: the Gateway API data plane that serves the operator's HTTPRoutes.

Traefik runs as a host process (one of the cluster's extras) with its Kubernetes Gateway provider and its
kubernetescrd provider, reading the API through the cluster's admin kubeconfig ($KUBECONFIG). It is built
from the Go module proxy by `hack/build-platform.sh traefik` and cached by version.

What it needs out of a cluster:
- the Gateway API CRDs of v1.4.0 or newer (chatfleet_platform.addons.gatewayapi): Traefik 3.6 lists
  BackendTLSPolicy v1, which v1.3.0 does not serve, and with v1.3.0 no route ever gets a status or traffic;
- one entryPoint per listener port: Traefik maps a Gateway listener to the entryPoint whose address ends
  in `:<listener port>`. The entryPoint listens on 127.0.0.1 on a port picked free, and every Gateway here
  has one HTTP listener on that same port;
- the Gateway's status address given (`statusaddress.ip`): without it no Gateway turns Programmed;
- Traefik's own CRDs (chatfleet_platform.addons.traefikcrd), for the kubernetescrd provider: an HTTPRoute
  backendRef may name a TraefikService, and a TraefikService mirrors (`spec.mirroring`), which the Gateway
  provider's HTTPRoute `RequestMirror` filter does not do in Traefik 3.6 (the rule answers 500).

The backends are the pods themselves: Traefik sends to the Ready addresses of a Service's EndpointSlices
(the real node's pods, on its bridge, reachable from this host), not to the ClusterIP.

Traefik forwards with its fast proxy (`experimental.fastProxy`), not its default one (Go's
net/http/httputil ReverseProxy). The default one cuts an answer now and then (Go issue 40747): for a
request with a Content-Length body, Go's transport sends the body, then reads the inbound body once more
to check that it is not longer than declared; an upstream that answers at once (a chat stream does) gets
its response headers written to the client first, writing them makes Go's HTTP/1 server drain and close
the inbound body, the late read fails, and the transport closes the upstream connection mid-answer
("ReverseProxy read error during body copy: use of closed network connection"; the client sees the stream
end without its last event). It needs the transport's goroutine to be late, so it shows under CPU load:
71 of 12,000 streamed chats in the platform's stream test on a 2-core machine, and 4 in 43,780 turns
through releases (bunched at Traefik's configuration reloads, which load the CPU). The fast proxy writes the whole
request before it reads the answer, and streams a chunked answer flushing each write. It does put a
connection whose answer said `Connection: close` back in its pool (the next request on it gets a 502 as
the upstream closes it), so the chat API sends no close until its drain has settled (docs/runtime.md
"Draining").
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from chatfleet_platform.common import procs
from chatfleet_platform.common.config import GATEWAY_BINARIES, read_json, require_binaries, write_json

from . import gatewayapi, traefikcrd

if TYPE_CHECKING:
    from chatfleet_platform.cluster.cluster import Cluster

#: The GatewayClass Traefik's Gateway provider claims (its controllerName is fixed by Traefik).
GATEWAY_CLASS = "traefik"
CONTROLLER_NAME = "traefik.io/gateway-controller"
#: The Gateway's name: the operator's default (--gateway, env CHATFLEET_GATEWAY).
GATEWAY_NAME = "chatfleet"
#: The shared Gateway's namespace; its listener admits routes from every namespace.
SHARED_NAMESPACE = "chatfleet-gateway"
PROCESS = "traefik"


def gateway_class() -> dict:
    """The GatewayClass handed to Traefik. Pure."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": GATEWAY_CLASS},
        "spec": {"controllerName": CONTROLLER_NAME},
    }


def gateway_manifest(namespace: str, port: int, *, routes_from: str = "All") -> dict:
    """Gateway `chatfleet` in `namespace`: one HTTP listener on Traefik's entryPoint port. Pure.

    routes_from: which namespaces' routes it admits (All, or Same: its own namespace's only).
    """
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY_NAME, "namespace": namespace},
        "spec": {
            "gatewayClassName": GATEWAY_CLASS,
            "listeners": [
                {
                    "name": "http",
                    "protocol": "HTTP",
                    "port": port,
                    "allowedRoutes": {"namespaces": {"from": routes_from}},
                }
            ],
        },
    }


def traefik_args(binary: str, port: int, access_log: str = "", *, fast_proxy: bool = True) -> list[str]:
    """Traefik's flags: one entryPoint on 127.0.0.1:port, the Gateway and CRD providers, nothing else. Pure.

    No dashboard, API, ping or metrics (any of them would open a second entryPoint, on all addresses);
    no version check and no usage statistics (nothing leaves the machine). The kubernetescrd provider
    serves TraefikServices (an HTTPRoute's backendRef may name one); it opens no port, and it does not
    watch Nodes (only NodePort load balancing would read them). Cross-namespace references and
    ExternalName Services stay refused (its defaults); a Service without endpoints is allowed, so a
    mirror with no Ready pod leaves the main Service answering. `fast_proxy=False` leaves Traefik's default
    proxy (only `make bench-release-traffic` does, for its baseline row).
    """
    return [
        binary,
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        f"--entryPoints.web.address=127.0.0.1:{port}",
        # stop within procs.stop's SIGTERM window (in-flight requests get 2 s)
        "--entryPoints.web.transport.lifeCycle.graceTimeOut=2s",
        "--providers.kubernetesgateway=true",
        "--providers.kubernetesgateway.statusaddress.ip=127.0.0.1",
        "--providers.kubernetescrd=true",
        "--providers.kubernetescrd.disableClusterScopeResources=true",
        # a mirror Service without a Ready endpoint (a shadow-phase canary pod lost or not Ready yet) must
        # cost nothing; with Traefik's default the whole TraefikService is not built and the rule answers 404
        "--providers.kubernetescrd.allowEmptyServices=true",
        # the fast proxy: Go's ReverseProxy cuts a streamed answer to a POST now and then (module docstring)
        *(["--experimental.fastProxy=true"] if fast_proxy else []),
        "--log.level=INFO",
        "--log.noColor=true",
        # one JSON line per request with the router, the backend service and the status: who answered a 5xx
        *(
            ["--accesslog=true", f"--accesslog.filepath={access_log}", "--accesslog.format=json"]
            if access_log
            else []
        ),
    ]


class Gateway:
    """Traefik and Gateway `chatfleet` for one local cluster (Traefik is one of the cluster's extras).

    `up()` installs the Gateway API CRDs, the GatewayClass, starts Traefik and the shared Gateway in
    `namespace` (routes from all namespaces), and waits until it is Programmed; `add(ns)` puts one more
    Gateway `chatfleet` in `ns` (its own routes only) on the same Traefik. `url` is where to send requests.
    """

    def __init__(
        self, cluster: Cluster, namespace: str = SHARED_NAMESPACE, *, fast_proxy: bool = True
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        #: Traefik's fast proxy (module docstring); False only for a benchmark's baseline
        self.fast_proxy = fast_proxy
        self.name = GATEWAY_NAME
        self.folder = cluster.workdir / "gateway"
        #: Traefik's entryPoint port (the one recorded by an earlier `up`, until `up` runs)
        self.port = int(read_json(self._state_file).get("port", 0))

    def route(self, name: str, namespace: str, hostname: str, rules: list[dict]) -> dict:
        """HTTPRoute `name` in `namespace` on the shared Gateway, for `hostname` only, with `rules`. Pure."""
        return {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "parentRefs": [{"name": self.name, "namespace": self.namespace}],
                "hostnames": [hostname],
                "rules": rules,
            },
        }

    @property
    def url(self) -> str:
        """http://127.0.0.1:<port>: Traefik's entryPoint, where every Gateway here listens."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """Traefik's log (under the cluster's logs)."""
        return self.cluster.log(PROCESS)

    @property
    def access_log(self) -> Path:
        """Traefik's access log: one JSON line per request (RouterName, ServiceName, DownstreamStatus)."""
        return self.cluster.log(f"{PROCESS}-access")

    @property
    def _state_file(self) -> Path:
        return self.folder / "state.json"

    def _proc(self) -> procs.Proc | None:
        return procs.Proc.from_json(self.cluster.state().get("extras", {}).get(PROCESS))

    def running(self) -> bool:
        """Whether the Traefik this cluster recorded is alive."""
        return procs.is_ours(self._proc())

    def up(self, timeout: float = 120) -> Gateway:
        """CRDs, GatewayClass, Traefik, the shared Gateway Programmed; harmless when already running.

        Traefik's own CRDs go in before Traefik starts: its kubernetescrd provider lists all of them and
        serves nothing until it can. A Traefik that runs with other flags than these (started by an older
        checkout) is restarted on the same port, so the Gateways' listeners stay valid.
        """
        binary = str(require_binaries(GATEWAY_BINARIES).traefik)
        c = self.cluster
        gatewayapi.install(c)
        traefikcrd.install(c)
        c.apply([gateway_class()])
        state = read_json(self._state_file)
        port = int(state.get("port") or 0)
        args = traefik_args(binary, port, str(self.access_log), fast_proxy=self.fast_proxy) if port else []
        if self.running() and port and state.get("args") == args:
            self.port = port
            c.progress(f"traefik already running on {self.url}")
        else:
            if self.running():
                c.progress("traefik runs with other flags: restarting it")
                c.stop_extra(PROCESS)
            self.port = port if port and not procs.port_in_use(port) else procs.free_port()
            args = traefik_args(binary, self.port, str(self.access_log), fast_proxy=self.fast_proxy)
            # the providers take $KUBECONFIG unless they find an in-cluster environment
            env = {k: v for k, v in c.env.items() if not k.startswith("KUBERNETES_SERVICE_")}
            c.start_extra(PROCESS, args, env=env)
            write_json(
                self._state_file, {"port": self.port, "gateways": state.get("gateways", []), "args": args}
            )
            procs.wait_for(
                f"traefik on 127.0.0.1:{self.port}",
                lambda: procs.port_in_use(self.port),
                timeout=timeout,
                log=self.log,
                proc=self._proc(),
            )
        self.add(self.namespace, routes_from="All", timeout=timeout)
        c.progress(f"Gateway {self.namespace}/{self.name} Programmed: {self.url}")
        return self

    def add(self, namespace: str, *, routes_from: str = "Same", timeout: float = 60) -> None:
        """Gateway `chatfleet` in `namespace` (created if missing) on this Traefik; waits for Programmed."""
        c = self.cluster
        c.kubectl("create", "namespace", namespace, check=False)  # AlreadyExists is fine
        c.apply([gateway_manifest(namespace, self.port, routes_from=routes_from)])
        state = read_json(self._state_file)
        state["gateways"] = sorted({*state.get("gateways", []), namespace})
        write_json(self._state_file, state)
        procs.wait_for(
            f"Gateway {namespace}/{self.name} Programmed",
            lambda: self.programmed(namespace),
            timeout=timeout,
            log=self.log,
            proc=self._proc(),
            interval=0.5,
        )

    def programmed(self, namespace: str | None = None) -> bool:
        """Whether Traefik has taken the Gateway of `namespace` (default the shared one) in hand."""
        res = self.cluster.kubectl(
            "get", "gateway", self.name, "-o", "json", namespace=namespace or self.namespace, check=False
        )
        if res.returncode != 0:
            return False
        gw = json.loads(res.stdout)
        generation = gw["metadata"].get("generation")
        # a condition of an earlier spec (a listener port of a Traefik since stopped) does not count
        return any(
            x["type"] == "Programmed" and x["status"] == "True" and x.get("observedGeneration") == generation
            for x in gw.get("status", {}).get("conditions", [])
        )

    def down(self) -> None:
        """Delete the Gateways it made and the GatewayClass, then stop Traefik (the CRDs stay)."""
        c = self.cluster
        for namespace in read_json(self._state_file).get("gateways", []):
            c.kubectl(
                "delete",
                "gateway",
                self.name,
                "--ignore-not-found",
                "--wait=false",
                namespace=namespace,
                check=False,
            )
        c.kubectl("delete", "gatewayclass", GATEWAY_CLASS, "--ignore-not-found", "--wait=false", check=False)
        c.stop_extra(PROCESS)
        self._state_file.unlink(missing_ok=True)


def server_errors(access_log: Path) -> dict[str, int]:
    """5xx answers in Traefik's JSON access log, counted by
    '<status> from <service> at <pod address> (origin <status>)'.

    An origin status of 0 means Traefik answered itself before choosing a pod (e.g. 503: the backend
    Service had no ready endpoint). The same status as the answer is either the pod's (e.g. a draining chat
    API's 503) or Traefik's own answer to a failed exchange with that pod: its proxy records 502 as the
    origin status on an EOF, a reset or a refused connection (504 on a timeout), and logs the cause at
    debug level only. The pods' chat API never answers 502.
    """
    out: Counter[str] = Counter()
    if not access_log.exists():
        return {}
    for line in access_log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        status = int(entry.get("DownstreamStatus") or 0)
        if status >= 500:
            where = f"{entry.get('ServiceName', '?')} at {entry.get('ServiceAddr') or '-'}"
            out[f"{status} from {where} (origin {entry.get('OriginStatus', 0)})"] += 1
    return dict(out)
