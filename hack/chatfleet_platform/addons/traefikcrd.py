"""Traefik's own CRDs (traefik.io/v1alpha1) for the local platform's Traefik, and the TraefikService shapes.

The Gateway provider of Traefik 3.6 does not implement the HTTPRoute `RequestMirror` filter: a rule that
has one answers 500 to every request (pkg/provider/kubernetes/gateway/httproute.go, `loadMiddlewares`;
the route's status still reads Accepted). With the kubernetescrd provider running beside it, an HTTPRoute
backendRef may name a TraefikService instead (`{group: traefik.io, kind: TraefikService, name}`), and a
TraefikService mirrors: `spec.mirroring` sends every request to its main Service and a percentage of them
to each mirror, whose answers are discarded. That is how a shadow phase copies traffic here.

The CRDs come from the Traefik module of the pinned version (TRAEFIK_VERSION in hack/versions.env, the
module the platform builds Traefik from): `go mod download -json` names its folder in the Go module
cache, and CRD_FILE in it holds all ten CRDs. Nothing is committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chatfleet_platform.common.config import PlatformError, go_module_dir, read_versions

MODULE = "github.com/traefik/traefik/v3"
GROUP = "traefik.io"
API_VERSION = f"{GROUP}/v1alpha1"
#: The CRDs of one Traefik release, in its module (the integration fixtures hold the same file).
CRD_FILE = Path("docs/content/reference/dynamic-configuration/kubernetes-crd-definition-v1.yml")
#: Every CRD in CRD_FILE: the kubernetescrd provider lists all of them and serves nothing until it can.
CRD_NAMES = (
    "ingressroutes.traefik.io",
    "ingressroutetcps.traefik.io",
    "ingressrouteudps.traefik.io",
    "middlewares.traefik.io",
    "middlewaretcps.traefik.io",
    "serverstransports.traefik.io",
    "serverstransporttcps.traefik.io",
    "tlsoptions.traefik.io",
    "tlsstores.traefik.io",
    "traefikservices.traefik.io",
)


def module_version() -> str:
    """The Traefik module version the platform builds, e.g. v3.6.12 (from hack/versions.env)."""
    return "v" + read_versions()["TRAEFIK_VERSION"]


def crd_file(version: str | None = None) -> Path:
    """CRD_FILE of the Traefik module, downloaded through the Go module proxy on first use."""
    version = version or module_version()
    path = go_module_dir(MODULE, version) / CRD_FILE
    if not path.is_file():
        raise PlatformError(f"{MODULE}@{version} has no {CRD_FILE}")
    return path


def install(cluster: Any, version: str | None = None, timeout: float = 60) -> None:
    """Apply Traefik's CRDs (server-side: they are too large for client-side apply); wait for Established."""
    cluster.install_crds(crd_file(version), CRD_NAMES, timeout)


def uninstall(cluster: Any) -> None:
    """Delete Traefik's CRDs (and with them every traefik.io object)."""
    cluster.uninstall_crds(GROUP, CRD_NAMES)


def traefik_service_ref(name: str, weight: int = 100) -> dict:
    """An HTTPRoute backendRef to TraefikService `name` in the route's namespace. Pure.

    No port: Traefik takes the TraefikService's own (a port is only required of kind Service). Example:
    traefik_service_ref("bot-mirror") == {"group": "traefik.io", "kind": "TraefikService",
    "name": "bot-mirror", "weight": 100}.
    """
    return {"group": GROUP, "kind": "TraefikService", "name": name, "weight": weight}


def mirroring_service(
    name: str,
    namespace: str,
    *,
    main: tuple[str, int],
    mirrors: list[tuple[str, int, int]],
    max_body_size: int | None = None,
) -> dict:
    """TraefikService `name`: every request to Service `main` (name, port), `percent` % to each mirror. Pure.

    mirrors: (Service name, port, percent 0..100) each. Traefik sends a mirror its copy only after the main
    answer has been written whole, and discards the mirror's answer. max_body_size: request bodies larger
    than this (bytes) go to the main Service only; None leaves Traefik's default, -1 (any size: the whole
    body is read into memory before the main Service gets it). Example: mirroring_service("bot-mirror",
    "ns", main=("bot", 8080), mirrors=[("bot-shadow", 8081, 25)]) mirrors 10 of 40 requests.
    """
    mirroring: dict[str, Any] = {
        "name": main[0],
        "port": main[1],
        "mirrors": [{"name": m, "port": port, "percent": percent} for m, port, percent in mirrors],
    }
    if max_body_size is not None:
        mirroring["maxBodySize"] = max_body_size
    return {
        "apiVersion": API_VERSION,
        "kind": "TraefikService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"mirroring": mirroring},
    }


if __name__ == "__main__":
    print(crd_file())
