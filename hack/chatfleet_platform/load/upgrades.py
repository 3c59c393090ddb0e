"""An operator upgrade seen from outside: which fleets roll a new pod template now, which are done, which wait.

The upgrade tests and `bench/upgrade_bench.py` tell two builds of the operator apart by the chat API's
CPU (the setting `CHATFLEET_CHAT_API_CPU` in the tests, the code's own default in the bench's builds): a
change to the pod template with the same revision, as a new annotation or env var in the builders makes. `sample` reads every stable Deployment and ChatbotService of the
cluster (or of one namespace) in two kubectl calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

STABLE = "chatfleet.io/track=stable"


def chat_api_cpu(dep: dict[str, Any]) -> str:
    """The chat-api container's CPU limit in a Deployment's pod template ("" when it has none)."""
    containers = dep["spec"]["template"]["spec"]["containers"]
    api = next((c for c in containers if c["name"] == "chat-api"), {})
    return str(((api.get("resources") or {}).get("limits") or {}).get("cpu", ""))


def rolling(dep: dict[str, Any]) -> bool:
    """The Deployment has not finished rolling out its template (old pods up, or new ones not available)."""
    st = dep.get("status") or {}
    return not (
        st.get("observedGeneration", 0) >= dep["metadata"]["generation"]
        and st.get("updatedReplicas", 0) >= 1
        and st.get("replicas", 0) <= st.get("updatedReplicas", 0)
        and st.get("availableReplicas", 0) >= 1
    )


def replacing(dep: dict[str, Any]) -> bool:
    """The Deployment is replacing pods now: its status (of the current generation) shows pods of two
    templates, or new ones not yet available. A write that bumps the generation without a new template
    (the operator's Deployment-level fields) replaces nothing, and the status of a generation the
    controller has not seen yet says nothing either way.
    """
    st = dep.get("status") or {}
    if st.get("observedGeneration", 0) < dep["metadata"]["generation"]:
        return False
    want = (dep.get("spec") or {}).get("replicas", 1)
    return (
        st.get("replicas", 0) > st.get("updatedReplicas", 0)
        or st.get("updatedReplicas", 0) < want
        or st.get("availableReplicas", 0) < st.get("replicas", 0)
    )


@dataclass(frozen=True)
class WaveSample:
    """One look at the fleets during an upgrade to the template whose chat API has `cpu`."""

    rolling: tuple[str, ...]
    """Fleets (namespace/name) on the new template and replacing their pods with it now."""
    done: tuple[str, ...]
    """Fleets on the new template, rolled out."""
    held: dict[str, str]
    """Fleets carrying UpgradeHeld now, with its reason."""
    fleets: int
    """Stable Deployments seen."""

    @property
    def finished(self) -> bool:
        """Every fleet on the new template, rolled out, none held."""
        return len(self.done) == self.fleets > 0 and not self.held


def classify(deployments: list[dict[str, Any]], bots: list[dict[str, Any]], cpu: str) -> WaveSample:
    """Pure: the sample for these stable Deployments and ChatbotServices (items of `kubectl get -o json`)."""
    key = lambda o: f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"  # noqa: E731
    new = [d for d in deployments if chat_api_cpu(d) == cpu]
    held = {
        key(b): c.get("reason", "")
        for b in bots
        for c in (b.get("status") or {}).get("conditions", [])
        if c.get("type") == "UpgradeHeld" and c.get("status") == "True"
    }
    return WaveSample(
        rolling=tuple(sorted(key(d) for d in new if replacing(d))),
        done=tuple(sorted(key(d) for d in new if not rolling(d))),
        held=held,
        fleets=len(deployments),
    )


def sample(cluster: Any, cpu: str, namespace: str | None = None) -> WaveSample:
    """The fleets now (every namespace unless one is named), against the template whose chat API has `cpu`."""
    scope = ("-n", namespace) if namespace else ("-A",)
    deps = cluster.kubectl("get", "deployment", *scope, "-l", STABLE, "-o", "json").stdout
    bots = cluster.kubectl("get", "chatbotservices", *scope, "-o", "json").stdout
    return classify(json.loads(deps)["items"], json.loads(bots)["items"], cpu)
