"""A pod-template change that is no release completes when no GPU is free (kwok GPU nodes, real scheduler).

Test design: the ChatbotService takes every GPU of the platform's only L4 node (2 replicas x 2 GPUs).
Then the operator is "upgraded": its process is stopped and passes of the same reconcile code run in
this process with other operator settings (the chat-api sidecar's CPU, a pod-template change that is
not a new revision). Then the original operator process comes back and changes the template back, again
with no GPU free. The real Deployment controller rolls each change and the real scheduler places the
pods on the kwok nodes: with the old surge-only strategy (maxSurge 1 / maxUnavailable 0) the surge pod
stays Pending on "Insufficient nvidia.com/gpu" forever. With spec.rollout.gpuCapacity Auto the
operator switches the Deployment to replace in place, and both rollouts finish.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest
from chatfleet_operator import kube as kube_api
from chatfleet_operator.cache import Snapshot, World, slim
from chatfleet_operator.converge.facts import PodFacts, node_facts, pod_facts
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import PodSettings, Settings
from operator_it import Kube, chatbot, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

L4 = {"gpuProduct": "NVIDIA-L4", "gpusPerReplica": 2, "cpu": "1", "memory": "4Gi"}
KINDS = {
    "deployment": "Deployment",
    "service": "Service",
    "poddisruptionbudget": "PodDisruptionBudget",
}


def snapshot(kube: Kube) -> Snapshot:
    """What the operator's watch caches would hold for `bot`, read from the API server."""
    snap = Snapshot()
    for plural, kind in KINDS.items():
        for obj in kube.get(plural, selector="chatfleet.io/service=bot") or []:
            snap.children[(kind, obj["metadata"]["name"])] = slim(obj)
    snap.pods = [pod_facts(p) for p in kube.get("pods", selector="chatfleet.io/service=bot") or []]
    nodes = json.loads(kube.cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    snap.nodes = [node_facts(n) for n in nodes]
    return snap


def chat_api_cpu(kube: Kube) -> str:
    """The chat-api container's CPU limit in the stable Deployment's template."""
    containers = kube.get("deployment", "bot")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "chat-api")["resources"]["limits"]["cpu"]


def rolled_out(kube: Kube, cpu: str) -> bool:
    """The Deployment runs the template with `cpu` on both replicas, all Ready, no old pod left."""
    dep = kube.get("deployment", "bot")
    st = dep.get("status") or {}
    pods = [
        p for p in kube.get("pods", selector="chatfleet.io/service=bot") or [] if p["status"].get("phase")
    ]
    return (
        chat_api_cpu(kube) == cpu
        and st.get("observedGeneration") == dep["metadata"]["generation"]
        and st.get("updatedReplicas") == 2
        and st.get("readyReplicas") == 2
        and st.get("replicas") == 2
        and len(pods) == 2
    )


class Watch:
    """Records what was seen while waiting: GPU-starved pods and the rolling-update strategies."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.starved = False
        self.strategies: set[tuple[Any, Any]] = set()

    def saw(self, pods: Iterable[PodFacts]) -> None:
        """Pods seen: a pass's (the operator acts on a starved pod it sees there, which may be scheduled
        again before the next look at the cluster) or the cluster's."""
        if any("nvidia.com/gpu" in facts.unschedulable_message for facts in pods):
            self.starved = True

    def look(self) -> None:
        """One look at the pods and the Deployment's strategy."""
        self.saw(pod_facts(p) for p in self.kube.get("pods", selector="chatfleet.io/service=bot") or [])
        ru = self.kube.get("deployment", "bot")["spec"]["strategy"]["rollingUpdate"]
        self.strategies.add((ru.get("maxSurge"), ru.get("maxUnavailable")))


def test_template_change_without_a_free_gpu_completes_both_ways(kube, operator):
    kube.apply(chatbot("bot", resources=L4, scaling={"replicas": 2}))
    kube.wait_ready("bot", 90)
    assert chat_api_cpu(kube) == "500m"
    body = kube.get("chatbotservice", "bot")
    assert body["status"]["gpus"] == 4  # the L4 node's 4 GPUs: none free for a surge pod

    # "operator v2": same code, other pod settings -> a new pod template, same revision
    operator.stop()
    try:
        kube_api.configure(str(kube.cluster.kubeconfig))
        v2 = Settings(pod=PodSettings(chat_api_cpu="600m"))
        world, watch = World(), Watch(kube)

        def pass_v2() -> bool:
            body = kube.get("chatbotservice", "bot")
            snap = snapshot(kube)
            watch.saw(snap.pods)
            reconcile_pass(kube_api, body, snap, world, v2, datetime.now(UTC))
            watch.look()
            return rolled_out(kube, "600m")

        done = wait_until(pass_v2, 120, interval=1.0)
        assert done, f"v2 template never rolled out; strategies {watch.strategies}, starved {watch.starved}"
        assert watch.starved, "the scenario never ran short of GPUs (a surge pod should have been Pending)"
        assert (0, 1) in watch.strategies, watch.strategies
        assert (
            kube.get("chatbotservice", "bot")["status"]["stableRevision"] == body["status"]["stableRevision"]
        )
    finally:
        operator.start()

    # the original operator changes the template back, again with no GPU free
    back = Watch(kube)

    def reverted() -> bool:
        back.look()
        return rolled_out(kube, "500m")

    assert wait_until(reverted, 120, interval=1.0), f"never rolled back to 500m; strategies {back.strategies}"
    kube.wait_ready("bot", 60)
    # once done, surge again (a free GPU will be used first next time)
    assert wait_until(
        lambda: kube.get("deployment", "bot")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 1, 30
    )
