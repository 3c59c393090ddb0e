"""Valid but unsatisfiable specs end in a condition and one Warning event, with backoff; pods that never
get Ready or crash loop show in the conditions; other ChatbotServices are unaffected.
"""

from __future__ import annotations

import time

import pytest
from operator_it import chatbot, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def stalled(kube, name: str, reason: str, timeout: float = 30) -> dict:
    """Wait for Stalled=True with that reason; return the condition."""
    ok = wait_until(
        lambda: (
            (c := kube.condition(name, "Stalled")).get("status") == "True" and c.get("reason") == reason and c
        ),
        timeout,
    )
    assert ok, f"{name}: no Stalled {reason}; conditions: {kube.get('chatbotservice', name).get('status')}"
    return ok


@pytest.mark.parametrize(
    ("resources", "reason", "words"),
    [
        pytest.param(
            {"gpuProduct": "NVIDIA-B200"}, "NoMatchingGPUNodes", "NVIDIA-B200", id="no-node-with-product"
        ),
        pytest.param(
            {"gpusPerReplica": 16}, "InsufficientGPUs", "gpusPerReplica=16", id="more-gpus-than-any-node"
        ),
    ],
)
def test_unsatisfiable_placement(kube, resources, reason, words):
    kube.apply(chatbot("good"), chatbot("bad", resources=resources))
    cond = stalled(kube, "bad", reason)
    assert words in cond["message"]
    ready = kube.condition("bad", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert kube.get("chatbotservice", "bad")["status"]["phase"] == "Failed"
    kube.wait_ready("good")  # the other ChatbotService is unaffected
    time.sleep(6)  # a retry or two happen; still one event, no hot loop
    warnings = [e for e in kube.events("bad") if e["type"] == "Warning" and e["reason"] == reason]
    assert len(warnings) == 1 and warnings[0].get("count", 1) == 1


def test_host_path_outside_the_allowed_prefixes_builds_nothing_until_the_spec_changes(kube):
    """The operator (--allowed-host-path: the local platform's prefixes) refuses /etc: one condition and
    one Warning event naming spec.model.hostPath, no Deployment, no retries; a fixed spec then converges.
    (A missing Secret is diagnosed from real pods: tests/realnode/test_realnode_missing_secret.py.)"""
    kube.apply(chatbot("bot", model={"hostPath": "/etc/kubernetes"}))
    cond = stalled(kube, "bot", "HostPathNotAllowed")
    assert "spec.model.hostPath '/etc/kubernetes'" in cond["message"] and "/models" in cond["message"]
    ready = kube.condition("bot", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "HostPathNotAllowed")
    time.sleep(6)  # a pass would have retried by now (5 s): it does not, and nothing is built
    assert kube.get("deployment", "bot") is None
    warnings = [e for e in kube.events("bot") if e["reason"] == "HostPathNotAllowed"]
    assert [e["type"] for e in warnings] == ["Warning"] and warnings[0].get("count", 1) == 1
    assert "spec.model.hostPath" in warnings[0]["message"]
    kube.apply(chatbot("bot", model={"hostPath": "/models/tiny"}))
    kube.wait_ready("bot", timeout=30)
    assert kube.condition("bot", "Stalled")["status"] == "False"


def test_fixing_the_spec_recovers_without_waiting_for_backoff(kube):
    kube.apply(chatbot("bot", resources={"gpuProduct": "NVIDIA-B200"}))
    stalled(kube, "bot", "NoMatchingGPUNodes")
    kube.apply(chatbot("bot", resources={"gpuProduct": "NVIDIA-L4"}))
    kube.wait_ready("bot", timeout=20)


def test_pods_that_never_get_ready_stall_at_the_progress_deadline(kube):
    kube.apply(
        chatbot(
            "bot",
            podMetadata={"labels": {"sim.chatfleet.io/health": "unready"}},
            analysis={"progressDeadlineSeconds": 10},
        )
    )
    # Pods on their way with nothing wrong yet: the operator holds the first status (its deadline, 10 s, comes
    # well before CHATFLEET_FIRST_STATUS_SECONDS), and the object reads as the CRD's default meanwhile.
    first = wait_until(lambda: (kube.get("chatbotservice", "bot").get("status") or {}).get("conditions"), 60)
    assert first, kube.get("chatbotservice", "bot").get("status")
    kinds = {c["type"]: (c["status"], c["reason"]) for c in first}
    assert kinds["Ready"][0] == "False" and kinds["Stalled"] == ("True", "ProgressDeadlineExceeded"), first
    cond = stalled(kube, "bot", "ProgressDeadlineExceeded", timeout=60)
    assert "progressDeadlineSeconds=10" in cond["message"]


def test_crash_looping_pods_make_it_degraded(kube):
    kube.apply(chatbot("bot", podMetadata={"labels": {"sim.chatfleet.io/health": "crashloop"}}))
    ok = wait_until(lambda: kube.condition("bot", "Degraded").get("status") == "True", 60)
    assert ok, kube.get("chatbotservice", "bot").get("status")
    assert kube.condition("bot", "Degraded")["reason"] == "CrashLoopBackOff"
    assert kube.condition("bot", "Ready")["status"] == "False"
    assert kube.get("chatbotservice", "bot")["status"]["phase"] == "Degraded"


def test_a_new_gpu_node_unblocks_without_waiting_for_backoff(kube, operator):
    """The node watch, not the retry timer or a pod, brings the pass. The bot has no replicas, so no pod
    event follows the node (with pods, their scheduling alone would run a pass); the node arrives once the
    operator has scheduled a retry 20 s away (retries back off 5, 10, 20 s), and the stall must clear well
    before that. Without the node watch the wait below runs out (tried: it does)."""
    from chatfleet_platform.cluster.nodes import GPUProduct, gpu_node

    product = "NVIDIA-GB300-TEST"
    kube.apply(chatbot("bot", resources={"gpuProduct": product}, scaling={"replicas": 0}))
    stalled(kube, "bot", "NoMatchingGPUNodes")
    later = f"ChatbotService {kube.ns}/bot, retry in 20s"
    assert wait_until(lambda: later in operator.log_text(), 45), "the operator never scheduled a 20 s retry"
    node = gpu_node("gpu-node-gb300", GPUProduct(product, 4, 288000, "test"), zone="zone-a")
    kube.cluster.add_nodes([node])
    try:
        assert wait_until(lambda: kube.condition("bot", "Stalled").get("status") != "True", 12), kube.get(
            "chatbotservice", "bot"
        ).get("status")
        assert kube.condition("bot", "Ready").get("status") == "True"
    finally:
        kube.cluster.kubectl("delete", "node", "gpu-node-gb300", "--wait=false", check=False)


def test_missing_image_stalls_with_image_pull_failed(kube):
    kube.apply(chatbot("bot", podMetadata={"labels": {"sim.chatfleet.io/health": "imagepull"}}))
    cond = stalled(kube, "bot", "ImagePullFailed", timeout=45)
    assert "spec.runtime.image" in cond["message"] and "ErrImagePull" in cond["message"]
    assert kube.condition("bot", "Ready")["status"] == "False"
    warnings = [e for e in kube.events("bot") if e["reason"] == "ImagePullFailed"]
    assert len(warnings) == 1
