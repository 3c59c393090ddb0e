"""Gateway API CRDs for the release tests and the demo, from the Go module `sigs.k8s.io/gateway-api`.

`go mod download -json sigs.k8s.io/gateway-api@<GATEWAY_API_VERSION>` fetches the module once into the Go
module cache (outside the repository); the standard-channel CRDs are read from its
config/crd/standard/ folder and never committed. Install/uninstall go through the cluster's kubectl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chatfleet_platform.common.config import PlatformError, go_module_dir

#: Pinned Gateway API release (standard channel: HTTPRoute v1 with weighted backendRefs). v1.4.0 at least:
#: Traefik 3.6 (chatfleet_platform.addons.gateway) lists BackendTLSPolicy v1, which v1.3.0 does not serve;
#: there it keeps retrying that list and never writes a route's status nor serves it.
GATEWAY_API_VERSION = "v1.4.0"
MODULE = "sigs.k8s.io/gateway-api"
GROUP_NAME = "gateway.networking.k8s.io"
#: Every CRD of that release's standard channel (config/crd/standard/).
CRD_NAMES = (
    "backendtlspolicies.gateway.networking.k8s.io",
    "gatewayclasses.gateway.networking.k8s.io",
    "gateways.gateway.networking.k8s.io",
    "grpcroutes.gateway.networking.k8s.io",
    "httproutes.gateway.networking.k8s.io",
    "referencegrants.gateway.networking.k8s.io",
)


def crd_dir(version: str = GATEWAY_API_VERSION) -> Path:
    """config/crd/standard of the module, downloaded through the Go module proxy on first use."""
    path = go_module_dir(MODULE, version) / "config" / "crd" / "standard"
    if not path.is_dir():
        raise PlatformError(f"{MODULE}@{version} has no config/crd/standard folder")
    return path


def install(cluster: Any, version: str = GATEWAY_API_VERSION, timeout: float = 60) -> None:
    """Apply the standard-channel CRDs and wait until they are Established."""
    cluster.install_crds(crd_dir(version), CRD_NAMES, timeout)


def uninstall(cluster: Any) -> None:
    """Delete the CRDs again (the cluster is shared by the whole test session)."""
    cluster.uninstall_crds(GROUP_NAME, CRD_NAMES)


if __name__ == "__main__":
    print(crd_dir())
