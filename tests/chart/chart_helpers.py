"""Helpers for the chart tests: helm from the platform's binaries, rendering with values, reading the output.

Rendering needs only the helm binary (no cluster): `make platform-build` builds it; without it the chart
tests are skipped with that hint.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from chatfleet_platform.common.config import REPO_ROOT, binaries
from needs import need_executable

CHART = REPO_ROOT / "charts" / "chatfleet-operator"
HELM = binaries().helm

#: (apiGroup, resource, verb)
Perm = tuple[str, str, str]

#: Value sets every rendering test runs through (id -> --set flags).
VALUE_SETS: dict[str, list[str]] = {
    "default": [],
    "ha": ["replicaCount=2"],
    "namespaces": ["watch.scope=namespaces", "watch.namespaces={team-a,team-b}"],
    "namespaces-ha": ["watch.scope=namespaces", "replicaCount=3"],
    "monitoring": [
        "monitoring.fleetPodMonitor.enabled=true",
        "monitoring.operatorPodMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.kubeStateMetrics.enabled=true",
        "monitoring.dashboard.enabled=true",
    ],
    "digest": ["image.digest=sha256:" + "a" * 64, "image.pullPolicy=Always"],
    "host-paths": ["operator.allowedHostPaths={/data,/srv/models}"],
    "fleet-networkpolicy": [
        "networkPolicy.fleets.enabled=true",
        "networkPolicy.fleets.namespaces={team-a,team-b}",
        "networkPolicy.fleets.gatewayNamespaces={gateway}",
    ],
    "prometheus-tls": [
        "operator.prometheus.ca.configMap=prometheus-ca",
        "operator.prometheus.bearerToken.serviceAccountToken.enabled=true",
        "operator.prometheus.bearerToken.serviceAccountToken.audience=prometheus",
        "operator.prometheus.bearerToken.hosts={prometheus.monitoring.svc}",
    ],
}


def need_helm() -> Path:
    """The helm binary, or fail the test with the way to build it."""
    return Path(need_executable("helm", "run `make setup` (or `make platform-build`)", path=HELM))


def helm(*args: str, check: bool = True, timeout: float = 120, env: Mapping[str, str] | None = None):
    """Run helm; returns the CompletedProcess (text)."""
    proc = subprocess.run(
        [str(need_helm()), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def set_flags(sets: Iterable[str]) -> list[str]:
    """--set flags for helm."""
    return [arg for s in sets for arg in ("--set", s)]


def render_text(
    sets: Iterable[str] = (), *, release: str = "cf", namespace: str = "chatfleet-system", crds: bool = False
) -> str:
    """`helm template` output (fails the test on any stderr output: the chart must render cleanly)."""
    args = ["template", release, str(CHART), "--namespace", namespace, *set_flags(sets)]
    proc = helm(*args, *(["--include-crds"] if crds else []))
    assert proc.stderr == "", f"helm template wrote to stderr:\n{proc.stderr}"
    return proc.stdout


def render(sets: Iterable[str] = (), **kwargs: Any) -> list[dict[str, Any]]:
    """Rendered manifests as dicts (empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(render_text(sets, **kwargs)) if doc]


def find(docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    """Documents of one kind (and name)."""
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: Iterable[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    """The single document of a kind."""
    found = find(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def granted(rules: Iterable[Mapping[str, Any]]) -> set[Perm]:
    """Expand RBAC rules into (group, resource, verb) triples."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
