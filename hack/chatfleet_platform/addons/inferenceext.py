"""The Gateway API Inference Extension's InferencePool CRD (inference.networking.k8s.io/v1), from the Go
module `sigs.k8s.io/gateway-api-inference-extension` (the module proxy serves pinned versions only; its
version list is refused). Fetched once into the Go module cache, never committed; install/uninstall go
through the cluster's kubectl, like chatfleet_platform.addons.gatewayapi.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chatfleet_platform.common.config import PlatformError, go_module_dir

#: Pinned release whose InferencePool is the GA v1 API (v1.0.0 was the first).
INFERENCE_EXTENSION_VERSION = "v1.0.2"
MODULE = "sigs.k8s.io/gateway-api-inference-extension"
GROUP_NAME = "inference.networking.k8s.io"
CRD_NAMES = ("inferencepools.inference.networking.k8s.io",)
CRD_FILE = "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"


def crd_file(version: str = INFERENCE_EXTENSION_VERSION) -> Path:
    """The v1 InferencePool CRD of the module, downloaded through the Go module proxy on first use."""
    path = go_module_dir(MODULE, version) / CRD_FILE
    if not path.is_file():
        raise PlatformError(f"{MODULE}@{version} has no {CRD_FILE}")
    return path


def install(cluster: Any, version: str = INFERENCE_EXTENSION_VERSION, timeout: float = 60) -> None:
    """Apply the InferencePool CRD and wait until it is Established."""
    cluster.install_crds(crd_file(version), CRD_NAMES, timeout)


def uninstall(cluster: Any) -> None:
    """Delete the CRD again (the cluster is shared by the whole test session)."""
    cluster.uninstall_crds(GROUP_NAME, CRD_NAMES)


if __name__ == "__main__":
    print(crd_file())
