"""Helpers for the release scenarios: the ChatbotService under release, polling, kubectl, the plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.3) -> Any:
    """Poll until predicate() is truthy; its value, or None at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


FAST_STEPS = [
    {"weight": 25, "pauseSeconds": 2},
    {"weight": 50, "pauseSeconds": 2},
    {"weight": 100, "pauseSeconds": 0},
]


def bot_spec(prometheus: str, **over: Any) -> dict[str, Any]:
    """A 2-replica H100 chatbot with fast release settings (interval 2 s, deadline 15 s, failureLimit 2)."""
    spec: dict[str, Any] = {
        "model": {"uri": "hf://org/tiny", "revision": "v1"},
        "resources": {
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "gpusPerReplica": 1,
            "cpu": "1",
            "memory": "4Gi",
        },
        "scaling": {"replicas": 2},
        "rollout": {"strategy": "canary", "canary": {"steps": FAST_STEPS}},
        "analysis": {
            "prometheusAddress": prometheus,
            "intervalSeconds": 2,
            "failureLimit": 2,
            "consecutiveErrorLimit": 2,
            "progressDeadlineSeconds": 15,
            "thresholds": {
                "errorRatePercent": 1,
                "latencyP99Milliseconds": 1000,
                "timeToFirstTokenP99Milliseconds": 1000,
            },
        },
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict) and key != "rollout":
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


class Release:
    """One ChatbotService in one namespace, watched through kubectl."""

    def __init__(self, cluster: Any, namespace: str, name: str) -> None:
        self.cluster, self.ns, self.name = cluster, namespace, name

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        """kubectl in the namespace."""
        return self.cluster.kubectl(*args, namespace=self.ns, check=check, input=input)

    def apply(self, spec: dict[str, Any]) -> None:
        """Create or update the ChatbotService."""
        doc = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": self.name},
            "spec": spec,
        }
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))

    def patch(self, spec_patch: dict[str, Any]) -> None:
        """JSON merge patch of the spec (a GitOps commit)."""
        self.kubectl(
            "patch", "chatbotservice", self.name, "--type=merge", "-p", json.dumps({"spec": spec_patch})
        )

    def body(self) -> dict[str, Any]:
        """The object now ({} if absent)."""
        res = self.kubectl("get", "chatbotservice", self.name, "-o", "json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else {}

    def status(self) -> dict[str, Any]:
        """status now."""
        return self.body().get("status") or {}

    def cond(self, ctype: str) -> dict[str, Any]:
        """A condition now."""
        return next((c for c in self.status().get("conditions") or [] if c["type"] == ctype), {})

    def release(self) -> dict[str, Any]:
        """status.release now."""
        return self.status().get("release") or {}

    def deployment(self, name: str) -> dict[str, Any]:
        """A Deployment ({} if absent)."""
        res = self.kubectl("get", "deployment", name, "-o", "json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else {}

    def service_selector(self, name: str | None = None) -> dict[str, str]:
        """spec.selector of a Service."""
        res = self.kubectl("get", "service", name or self.name, "-o", "json", check=False)
        return (json.loads(res.stdout).get("spec") or {}).get("selector", {}) if res.returncode == 0 else {}

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        """Events about the ChatbotService."""
        items = json.loads(self.kubectl("get", "events", "-o", "json").stdout).get("items", [])
        return [
            e
            for e in items
            if e["involvedObject"].get("name") == self.name
            and e["involvedObject"].get("kind") == "ChatbotService"
            and (reason is None or e.get("reason") == reason)
        ]

    def wait(self, predicate: Callable[[Release], Any], timeout: float, what: str) -> Any:
        """Wait for a predicate on this release; fails with the status when it never holds."""
        value = wait_until(lambda: predicate(self), timeout)
        if not value:
            res = self.kubectl("get", "chatbotservice", self.name, "-o", "json", check=False)
            now = (json.loads(res.stdout).get("status") or {}) if res.returncode == 0 else res.stderr
            raise AssertionError(
                f"{what} did not happen within {timeout}s; status:\n{json.dumps(now, indent=1)[-4000:]}"
            )
        return value

    def plugin(self, *args: str, expect: int = 0) -> str:
        """Run `kubectl chatbot ARGS -n NS` (the plugin); its output, once it exited with `expect`."""
        env = {**os.environ, **self.cluster.env}
        res = subprocess.run(
            [sys.executable, "-m", "chatfleet_operator.plugin", *args, "-n", self.ns],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert res.returncode == expect, (res.returncode, res.stdout, res.stderr)
        return res.stdout


def promoted_to(revision: str) -> Callable[[Release], bool]:
    """Predicate: the release of `revision` finished and stable runs it."""
    return lambda r: r.status().get("stableRevision") == revision and not r.release()


def rolled_back(r: Release) -> bool:
    """Predicate: the release is rolled back (Stalled RolledBack)."""
    return r.cond("Stalled").get("reason") == "RolledBack" and r.cond("Stalled").get("status") == "True"


def start(bot: Release, prometheus: Any, **over: Any) -> str:
    """Create the bot on revision v1, wait for Ready; its stable revision."""
    bot.apply(bot_spec(prometheus.url, **over))
    bot.wait(lambda r: r.cond("Ready").get("status") == "True", 60, "bot Ready on v1")
    return bot.status()["stableRevision"]


def release(bot: Release, **model: Any) -> str:
    """Change the model revision (a GitOps commit); the new updateRevision."""
    before = bot.status().get("updateRevision")
    bot.patch({"model": {"revision": "v2", **model}})
    return bot.wait(
        lambda r: r.status().get("updateRevision") not in (None, before) and r.status()["updateRevision"],
        30,
        "new revision seen",
    )
