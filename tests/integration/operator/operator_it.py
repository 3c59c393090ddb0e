"""Helpers for the operator integration tests: polling, kubectl in one namespace, manifests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import yaml


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll until predicate() is truthy; return its value, or None on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


class Kube:
    """Small kubectl helpers bound to one namespace."""

    def __init__(self, cluster: Any, namespace: str, operator: Any = None) -> None:
        self.cluster, self.ns, self.operator = cluster, namespace, operator

    def apply(self, *docs: dict[str, Any]) -> None:
        """kubectl apply the documents."""
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), namespace=self.ns)

    def get(self, kind: str, name: str | None = None, selector: str | None = None) -> Any:
        """Object (or list items with a selector or no name) as dicts; None if not found."""
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if selector:
            args += ["-l", selector]
        res = self.cluster.kubectl(*args, namespace=self.ns, check=False)
        if res.returncode != 0:
            return None
        data = json.loads(res.stdout)
        return data.get("items", []) if name is None else data

    def condition(self, name: str, ctype: str) -> dict[str, Any]:
        """A condition of a ChatbotService ({} if absent)."""
        body = self.get("chatbotservice", name) or {}
        return next((c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == ctype), {})

    def wait_ready(self, name: str, timeout: int = 60) -> dict[str, Any]:
        """kubectl wait --for=condition=Ready; returns the object."""
        res = self.cluster.kubectl(
            "wait",
            "--for=condition=Ready",
            f"chatbotservice/{name}",
            f"--timeout={timeout}s",
            namespace=self.ns,
            check=False,
            timeout=timeout + 10,
        )
        assert res.returncode == 0, f"{name} not Ready: {res.stderr}\n{self.diagnose(name)}"
        return self.get("chatbotservice", name)

    def diagnose(self, name: str) -> str:
        """What a failed wait needs: the object's status, its pods and Deployments, recent events."""
        body = self.get("chatbotservice", name) or {}
        pods = [
            f"{p['metadata']['name']} node={p['spec'].get('nodeName')} phase={p['status'].get('phase')} "
            f"conditions={[(c['type'], c['status'], c.get('reason')) for c in p['status'].get('conditions', [])]}"
            for p in self.get("pods", selector=f"chatfleet.io/service={name}") or []
        ]
        deployments = [
            f"{d['metadata']['name']} {d.get('status', {})}"
            for d in self.get("deployment", selector=f"chatfleet.io/service={name}") or []
        ]
        events = [
            f"{e['involvedObject']['kind']}/{e['involvedObject'].get('name')} {e.get('reason')}: {e.get('message')}"
            for e in (self.get("events") or [])[-15:]
        ]
        return "\n".join(
            [
                json.dumps(body.get("status", {}), indent=1)[-2000:],
                "pods:",
                *pods,
                "deployments:",
                *deployments,
                "events:",
                *events,
                "operator log:",
                self.operator.log_text()[-3000:] if self.operator else "-",
            ]
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        """Events about a ChatbotService."""
        items = self.get("events") or []
        return [
            e
            for e in items
            if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "ChatbotService"
        ]


def chatbot(name: str, **spec: Any) -> dict[str, Any]:
    """A ChatbotService manifest; spec parts as keyword arguments (model defaults to a hub URI)."""
    spec.setdefault("model", {"uri": "hf://org/tiny"})
    return {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name},
        "spec": spec,
    }
