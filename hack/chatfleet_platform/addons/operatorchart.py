"""The operator installed by its own Helm chart (`charts/chatfleet-operator`) on the local platform, its pod on
a real node running a locally built operator image: what `helm install` and `helm upgrade` do to a cluster.

Used by the real-pod test of the chart's operator and by `make bench-chaos-upgrades`, whose operator builds
are images upgraded by `helm upgrade`. The image is never pulled (`image.pullPolicy=Never`): it must have
been imported into the real node's containerd (every built image is; `ImageBuilder.build_edited_into` imports
other builds).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatfleet_platform.cluster.realnode import REAL_LABEL
from chatfleet_platform.common.config import REPO_ROOT, PlatformError, binaries

CHART = REPO_ROOT / "charts" / "chatfleet-operator"


def image_values(ref: str) -> list[str]:
    """helm flags that run the operator from the local image `ref` (repository:tag), never pulled."""
    repo, tag = ref.rsplit(":", 1)
    return [
        "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
    ]  # fmt: skip


def real_node_values() -> list[str]:
    """helm flags that place the operator's pod on the real nodes (their label, their taint tolerated)."""
    escaped = REAL_LABEL.replace(".", "\\.")
    return [
        "--set-string", f"nodeSelector.{escaped}=true",
        "--set", f"tolerations[0].key={REAL_LABEL}", "--set", "tolerations[0].operator=Exists",
    ]  # fmt: skip


@dataclass
class OperatorChart:
    """The chart's release `release` in `namespace` of `cluster` (a `Cluster`)."""

    cluster: Any
    namespace: str
    release: str = "cf"

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run helm against the cluster; a PlatformError with helm's output when it fails."""
        env = {**self.cluster.env, "HELM_CACHE_HOME": str(REPO_ROOT / ".work" / "helm-cache")}
        res = subprocess.run(
            [str(binaries().helm), *args], capture_output=True, text=True, env=env, timeout=timeout
        )
        if res.returncode != 0:
            raise PlatformError(f"helm {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
        return res

    def install(self, values: Sequence[str], *, wait: bool = True) -> None:
        """`helm install` with these flags (the CRDs are the caller's: --skip-crds)."""
        waiting = ["--wait", "--timeout", "240s"] if wait else []
        self.helm("install", self.release, str(CHART), "-n", self.namespace, "--skip-crds", *values, *waiting)

    def upgrade(self, values: Sequence[str], *, wait: bool = True) -> None:
        """`helm upgrade --reuse-values` with these flags over the installed ones."""
        waiting = ["--wait", "--timeout", "240s"] if wait else []
        self.helm(
            "upgrade", self.release, str(CHART), "-n", self.namespace, "--skip-crds", "--reuse-values",
            *values, *waiting,
        )  # fmt: skip

    def uninstall(self) -> None:
        """`helm uninstall`, waited for up to a minute; a failure is left to the namespace's deletion."""
        subprocess.run(
            [str(binaries().helm), "uninstall", self.release, "-n", self.namespace, "--wait", "--timeout", "60s"],
            capture_output=True, env=self.cluster.env, timeout=120,
        )  # fmt: skip

    def pods(self) -> list[dict]:
        """The operator's pods (everything in the release's namespace)."""
        res = self.cluster.kubectl("get", "pods", "-o", "json", namespace=self.namespace)
        return json.loads(res.stdout)["items"]

    def log(self, tail: int = 4000) -> str:
        """The last `tail` characters of the operator pods' logs."""
        logs = [
            self.cluster.kubectl("logs", p["metadata"]["name"], namespace=self.namespace, check=False).stdout
            for p in self.pods()
        ]
        return "\n".join(logs)[-tail:]
