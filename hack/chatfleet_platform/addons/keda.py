"""KEDA on the local platform: its operator and metrics adapter as host processes behind an APIService.

KEDA serves the external metrics API (`external.metrics.k8s.io`) that the real HPA controller in
kube-controller-manager reads; a ScaledObject names the query, KEDA writes the HPA. Both binaries are
built from the Go module proxy by `hack/build-platform.sh keda` and cached by version.

Out of a cluster, KEDA needs:
- `KEDA_CLUSTER_OBJECT_NAMESPACE` / `POD_NAMESPACE` (its own namespace, `keda`), and `WATCH_NAMESPACE`
  set, empty for all namespaces (the adapter exits when it is unset);
- mutual TLS between the operator (gRPC metrics service) and the adapter: one CA, one certificate with
  serverAuth + clientAuth for `keda-operator`, `localhost`, 127.0.0.1;
- the adapter's serving certificate valid for `keda-metrics-apiserver.keda.svc`, the name the API
  server's aggregation layer checks, and the APIService's caBundle;
- the API server's aggregation layer (front-proxy flags, see cluster.py), and a Service the aggregator
  can dial: an ExternalName Service `localhost`, so the adapter binds 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from chatfleet_platform.common import pki, procs
from chatfleet_platform.common.config import PlatformError, cache_dir, read_versions

if TYPE_CHECKING:
    from chatfleet_platform.cluster.cluster import Cluster

NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
APISERVICE = "v1beta1.external.metrics.k8s.io"
#: Names the operator's gRPC certificate must carry (the adapter dials it as `keda-operator`).
OPERATOR_NAMES = ("keda-operator", f"keda-operator.{NAMESPACE}.svc", "localhost")
#: Names the adapter's serving certificate must carry (the aggregator checks `<service>.<ns>.svc`).
ADAPTER_NAMES = (f"{ADAPTER_SERVICE}.{NAMESPACE}.svc", f"{ADAPTER_SERVICE}.{NAMESPACE}", "localhost")


@dataclass(frozen=True)
class KedaBinaries:
    """Where the pinned KEDA build lives."""

    folder: Path

    @property
    def operator(self) -> Path:
        """The KEDA operator (ScaledObject -> HPA, the metrics gRPC service)."""
        return self.folder / "keda-operator"

    @property
    def adapter(self) -> Path:
        """The metrics adapter (the external metrics API server)."""
        return self.folder / "keda-adapter"

    @property
    def crds(self) -> Path:
        """KEDA's CRDs, copied from the module source at build time."""
        return self.folder / "crds"


def keda_binaries() -> KedaBinaries:
    """The KEDA build of the pinned version, or a PlatformError saying how to build it."""
    version = read_versions()["KEDA_VERSION"]
    found = KedaBinaries(cache_dir() / "bin" / f"keda-{version}")
    if not (found.operator.exists() and found.adapter.exists() and found.crds.is_dir()):
        raise PlatformError(
            f"KEDA v{version} is not built: run `bash hack/build-platform.sh keda` "
            f"(builds from the Go module proxy into {found.folder})"
        )
    return found


def service_manifests(ca_pem: bytes, port: int) -> list[dict]:
    """The namespace, the adapter's ExternalName Service and the APIService that names it. Pure."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "caBundle": base64.b64encode(ca_pem).decode(),
                "service": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE, "port": port},
            },
        },
    ]


class Keda:
    """Start and stop KEDA for one local cluster (its processes are the cluster's extras)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.folder = cluster.workdir / "keda"

    def up(self, timeout: float = 120) -> None:
        """Install the CRDs, start the operator and the adapter, register and wait for the APIService."""
        bins = keda_binaries()
        c = self.cluster
        certs = self.folder / "certs"
        ca, crt, key = pki.serving_pair(certs, "tls", dns=(*OPERATOR_NAMES, *ADAPTER_NAMES), client_auth=True)
        for crd in sorted(bins.crds.glob("*.yaml")):
            c.kubectl("apply", "--server-side", "-f", str(crd))
        ports = {
            name: procs.free_port() for name in ("metrics", "health", "grpc", "adapter", "adapter_metrics")
        }
        # WATCH_NAMESPACE empty: every namespace (the adapter refuses to start when it is unset)
        env = {
            **c.env,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            "POD_NAMESPACE": NAMESPACE,
            "WATCH_NAMESPACE": "",
        }
        kc = str(c.kubeconfig)
        c.start_extra(
            "keda-operator",
            [
                str(bins.operator),
                f"--kubeconfig={kc}",
                f"--cert-dir={certs}",
                f"--ca-dir={certs}",
                f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{ports['health']}",
                f"--metrics-service-bind-address=127.0.0.1:{ports['grpc']}",
                "--enable-webhook-patching=false",
                "--enable-apiservice-patching=false",
                "--zap-log-level=info",
            ],
            env=env,
        )
        adapter = c.start_extra(
            "keda-adapter",
            [
                str(bins.adapter),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--lister-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['adapter']}",
                f"--tls-cert-file={crt}",
                f"--tls-private-key-file={key}",
                f"--cert-dir={certs}",
                f"--metrics-service-address=127.0.0.1:{ports['grpc']}",
                "--metrics-service-grpc-authority=keda-operator",
                f"--port={ports['adapter_metrics']}",
            ],
            env=env,
        )
        c.apply(service_manifests(ca.read_bytes(), ports["adapter"]))
        procs.wait_for(
            f"APIService {APISERVICE} Available",
            self.available,
            timeout=timeout,
            log=c.log("keda-adapter"),
            proc=adapter,
        )

    def available(self) -> bool:
        """Whether the aggregator reaches the adapter (the APIService's Available condition)."""
        res = self.cluster.kubectl("get", "apiservice", APISERVICE, "-o", "json", check=False)
        if res.returncode != 0:
            return False
        conditions = json.loads(res.stdout).get("status", {}).get("conditions", [])
        return any(x["type"] == "Available" and x["status"] == "True" for x in conditions)

    def down(self) -> None:
        """Unregister the APIService (so discovery does not stall on it), then stop both processes."""
        self.cluster.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        for name in ("keda-adapter", "keda-operator"):
            self.cluster.stop_extra(name)
