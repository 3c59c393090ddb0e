"""A PodMonitor as Prometheus scrape configs: pod discovery through the Kubernetes API, no static labels.

The local platform has no Prometheus Operator, so this does its job for the chart's PodMonitors:

- Discovery: `kubernetes_sd_configs` with role pod, against the local API server.
- The selector and the endpoint's port name become `keep` rules.
- The standard target labels are added: namespace, pod, container, endpoint, job.
- The PodMonitor's own `relabelings` follow.

The track, service and revision labels thus come from the pods' own labels, as they would on a real
cluster.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def _label_name(key: str) -> str:
    """A pod label key as Prometheus's meta label suffix: chatfleet.io/track -> chatfleet_io_track."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _snake(key: str) -> str:
    """A PodMonitor relabeling key as Prometheus's: sourceLabels -> source_labels."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def selector_rules(selector: dict[str, Any]) -> list[dict[str, Any]]:
    """`keep` relabel rules for a label selector (matchLabels and matchExpressions In/NotIn/Exists/DoesNotExist)."""
    rules: list[dict[str, Any]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        name = _label_name(key)
        rules.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_pod_label_{name}",
                    f"__meta_kubernetes_pod_labelpresent_{name}",
                ],
                "regex": f"({re.escape(str(value))});true",
            }
        )
    for expr in selector.get("matchExpressions") or []:
        name, op = _label_name(expr["key"]), expr["operator"]
        present = f"__meta_kubernetes_pod_labelpresent_{name}"
        value = f"__meta_kubernetes_pod_label_{name}"
        alternatives = "|".join(re.escape(str(v)) for v in expr.get("values") or [])
        if op == "Exists":
            rules.append({"action": "keep", "source_labels": [present], "regex": "true"})
        elif op == "DoesNotExist":
            rules.append({"action": "drop", "source_labels": [present], "regex": "true"})
        elif op == "In":
            rules.append(
                {"action": "keep", "source_labels": [value, present], "regex": f"({alternatives});true"}
            )
        elif op == "NotIn":
            rules.append(
                {"action": "drop", "source_labels": [value, present], "regex": f"({alternatives});true"}
            )
        else:
            raise ValueError(f"selector operator {op!r} is not one of In, NotIn, Exists, DoesNotExist")
    return rules


def podmonitor_scrape_configs(
    podmonitor: dict[str, Any], *, api_server: str, pki_dir: Path, scrape_interval: str | None = None
) -> list[dict[str, Any]]:
    """One Prometheus scrape config per podMetricsEndpoint of a PodMonitor, discovering pods via the API."""
    meta, spec = podmonitor["metadata"], podmonitor["spec"]
    ns_sel = spec.get("namespaceSelector") or {}
    sd: dict[str, Any] = {
        "role": "pod",
        "api_server": api_server,
        "tls_config": {
            "ca_file": str(pki_dir / "ca.crt"),
            "cert_file": str(pki_dir / "admin.crt"),
            "key_file": str(pki_dir / "admin.key"),
        },
    }
    if not ns_sel.get("any") and ns_sel.get("matchNames"):
        sd["namespaces"] = {"names": list(ns_sel["matchNames"])}
    configs = []
    for i, ep in enumerate(spec.get("podMetricsEndpoints") or []):
        relabel = [
            # pods that finished have no endpoint to scrape (as the Prometheus Operator drops them)
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            *selector_rules(spec.get("selector") or {}),
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": ep["port"],
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"target_label": "endpoint", "replacement": ep["port"]},
            {"target_label": "job", "replacement": f"{meta.get('namespace', 'default')}/{meta['name']}"},
            *[{_snake(k): v for k, v in r.items()} for r in ep.get("relabelings") or []],
        ]
        cfg: dict[str, Any] = {
            "job_name": f"podMonitor/{meta.get('namespace', 'default')}/{meta['name']}/{i}",
            "metrics_path": ep.get("path", "/metrics"),
            "kubernetes_sd_configs": [sd],
            "relabel_configs": relabel,
        }
        if ep.get("interval") or scrape_interval:
            cfg["scrape_interval"] = scrape_interval or ep["interval"]
        configs.append(cfg)
    return configs
