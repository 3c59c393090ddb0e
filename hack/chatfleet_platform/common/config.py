"""Where things are: pinned versions, the binary cache, the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
VERSIONS_FILE = REPO_ROOT / "hack" / "versions.env"
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-platform.sh"
#: The ChatbotService CRD: its file and its name (what `Cluster.install_crd` waits for).
CHATBOT_CRD_FILE = REPO_ROOT / "crds" / "chatfleet.io_chatbotservices.yaml"
CHATBOT_CRD_NAME = "chatbotservices.chatfleet.io"
#: Operator flags for the local platform: its Prometheus and trafficsim listen on 127.0.0.1, which the
#: release analysis may call only when allowed (by default only cluster-internal *.svc hosts).
LOCAL_ANALYSIS_ARGS = ("--analysis-allowed-host=127.0.0.1",)
#: Host directories the local platform's ChatbotServices name in spec.model.hostPath: the tiny models the
#: real node's pods mount (under .work), and the paths of the examples and chart tests on simulated nodes
#: (never mounted there). The operator refuses any other (--allowed-host-path; by default it allows none).
LOCAL_HOST_PATHS = ("/models", "/var/lib/models", str(REPO_ROOT / ".work"))
#: Operator flags allowing them.
LOCAL_HOST_PATH_ARGS = tuple(f"--allowed-host-path={path}" for path in LOCAL_HOST_PATHS)
#: The operator's environment for pods on the local real node: its 2 cores bind before its fake GPUs do,
#: so the chat-api sidecar asks for less CPU (3 pods of a release's promotion fit: 3 x (250m + 300m)).
#: The startup probe keeps the product's budget: a load that hangs in Triton's Python backend ends through
#: the runtime's load watch (docs/runtime.md, "Start-up"), not through a shorter probe.
REAL_NODE_OPERATOR_ENV = {"CHATFLEET_CHAT_API_CPU": "300m"}


class PlatformError(RuntimeError):
    """A problem the user must act on; its message says what and how."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse KEY=VALUE lines of versions.env (comments and blanks ignored)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def cache_dir() -> Path:
    """The binary cache, outside the repository: $CHATFLEET_CACHE or ~/.cache/chatfleet."""
    env = os.environ.get("CHATFLEET_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "chatfleet"


@dataclass(frozen=True)
class Binaries:
    """Paths of the platform's executables, keyed by the pinned versions."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kubelet: Path
    kube_proxy: Path
    kwok: Path
    helm: Path
    prometheus: Path
    traefik: Path

    def missing(self, names: tuple[str, ...] | None = None) -> list[str]:
        """Names of binaries (all, or those named) that are not built yet."""
        return [
            name
            for name, path in vars(self).items()
            if (names is None or name in names) and not os.access(path, os.X_OK)
        ]

    @property
    def bin_dirs(self) -> list[Path]:
        """Folders to put on PATH so kubectl and helm are found."""
        return sorted({p.parent for p in vars(self).values()})


def binaries(versions: dict[str, str] | None = None) -> Binaries:
    """Where the pinned binaries live (built or not)."""
    v = versions or read_versions()
    b = cache_dir() / "bin"
    k8s = b / f"kubernetes-{v['K8S_VERSION']}"
    return Binaries(
        etcd=b / f"etcd-{v['ETCD_VERSION']}" / "etcd",
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kubectl=k8s / "kubectl",
        kubelet=k8s / "kubelet",
        kube_proxy=k8s / "kube-proxy",
        kwok=b / f"kwok-{v['KWOK_VERSION']}" / "kwok",
        helm=b / f"helm-{v['HELM_VERSION']}" / "helm",
        prometheus=b / f"prometheus-{v['PROMETHEUS_VERSION']}" / "prometheus",
        traefik=b / f"traefik-{v['TRAEFIK_VERSION']}" / "traefik",
    )


CLUSTER_BINARIES = ("etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kubectl", "kwok")
#: What a real node runs besides containerd and runc (Debian packages).
NODE_BINARIES = ("kubelet", "kube_proxy")
#: The Gateway API data plane (chatfleet_platform.addons.gateway).
GATEWAY_BINARIES = ("traefik",)


def require_binaries(names: tuple[str, ...] = CLUSTER_BINARIES) -> Binaries:
    """The binaries, or a PlatformError naming what is missing (of `names`) and how to build it."""
    bins = binaries()
    missing = bins.missing(names)
    if missing:
        raise PlatformError(
            f"platform binaries not built: {', '.join(missing)}; run `make platform-build` "
            f"(builds from the Go module proxy into {cache_dir() / 'bin'})"
        )
    return bins


def require_tool(name: str, hint: str) -> str:
    """Path of an executable on PATH, or a PlatformError that names it and how to install it."""
    path = shutil.which(name)
    if not path:
        raise PlatformError(f"{name} is missing: {hint}")
    return path


def read_json(path: Path) -> dict:
    """A state file's content ({} when it is missing or not whole JSON)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict) -> None:
    """Write a state file atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def go_module_dir(module: str, version: str) -> Path:
    """The module's source folder in the Go module cache (outside the repository), fetched once.

    `go mod download -json MODULE@VERSION` answers from the cache when it has the module, else downloads it
    through the Go module proxy; its JSON names the folder (`Dir`). A PlatformError says why it failed.
    """
    go = require_tool("go", "install Go >= 1.26 (the platform builds its binaries from Go modules)")
    with tempfile.TemporaryDirectory() as tmp:  # outside any go.mod, so no module's requirements apply
        res = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
    try:
        info = json.loads(res.stdout)
    except ValueError:
        info = {}
    if res.returncode != 0 or not info.get("Dir") or not Path(info["Dir"]).is_dir():
        detail = info.get("Error") or res.stderr.strip() or res.stdout.strip()
        raise PlatformError(f"cannot fetch {module}@{version} from the Go module proxy: {detail}")
    return Path(info["Dir"])
