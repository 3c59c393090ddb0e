"""A ChatbotService of a real-node test, seen through kubectl: apply, patch, status, conditions, pods, endpoints."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from chatfleet_platform.services import wait_until


class Bot:
    """The ChatbotService `bot` of one namespace."""

    def __init__(self, cluster, ns: str) -> None:
        self.cluster, self.ns, self.name = cluster, ns, "bot"

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.cluster.kubectl(*args, namespace=self.ns, **kw)

    def apply(self, spec: dict[str, Any]) -> None:
        doc = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": self.name},
        }
        self.kubectl("apply", "-f", "-", input=json.dumps({**doc, "spec": spec}))

    def patch(self, spec: dict[str, Any]) -> None:
        self.kubectl("patch", "cbs", self.name, "--type=merge", "-p", json.dumps({"spec": spec}))

    def status(self) -> dict[str, Any]:
        res = self.kubectl("get", "cbs", self.name, "-o", "json", check=False)
        return json.loads(res.stdout).get("status", {}) if res.returncode == 0 else {}

    def cond(self, ctype: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions", []) if c["type"] == ctype), {})

    def wait(self, predicate, timeout: float, what: str) -> Any:
        value = wait_until(predicate, timeout, 2)
        pods = self.kubectl("get", "pods", "-o", "wide", check=False).stdout
        assert value, (
            f"{what} did not happen in {timeout}s; status:\n{json.dumps(self.status(), indent=1)[-3000:]}\n{pods}"
        )
        return value

    def pods(self, track: str) -> list[dict[str, Any]]:
        res = self.kubectl("get", "pods", "-l", f"chatfleet.io/track={track}", "-o", "json")
        return json.loads(res.stdout)["items"]

    def endpoint_pods(self) -> set[str]:
        res = self.kubectl(
            "get", "endpointslices", "-l", f"kubernetes.io/service-name={self.name}", "-o", "json"
        )
        return {
            e["targetRef"]["name"]
            for s in json.loads(res.stdout)["items"]
            for e in s.get("endpoints") or []
            if e.get("conditions", {}).get("ready") and e.get("targetRef")
        }


def rolled_back(bot: Bot) -> bool:
    stalled = bot.cond("Stalled")
    return stalled.get("status") == "True" and stalled.get("reason") == "RolledBack"
