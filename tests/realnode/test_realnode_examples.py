"""The examples, run for real: the operator's pods start on the real node and answer a chat through the
Service.

Test design: every example that admits a ChatbotService is put on the real node's CPU (`on_real_node`: the
tiny model by hostPath, the locally built image, fp32, CPU-sized resources) and applied in its own
namespace, in waves of two: a runtime pod requests 0.55 CPU (Triton 250m + the chat API's 300m), the
real node has two, and a rolling update's surge pod needs room beside its wave. Each must turn Ready, which needs the real kubelet's probes on the real Triton and
the real chat API. Each must then answer a chat through its Service's ClusterIP (kube-proxy's rules), with
the Triton instances on the CPU because the device plugin marked the GPU simulated. Before the CPU path,
the Triton container died on KIND_GPU with no GPU, and no example turned Ready. An example with
spec.fallback (04-full) must have its breaker threshold and FAQ in force on the running pod (its scrape
port), and a change of spec.fallback must reach that same pod with no restart, no new template and no
release (the operator's pod annotation, the real kubelet's downward API file, the chat API's re-read).
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
import yaml
from chatfleet_platform.common.config import REPO_ROOT
from chatfleet_platform.load.realpods import chat_once, on_real_node, service_url
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EXAMPLES = sorted((REPO_ROOT / "examples").glob("0*.yaml"))


def chatbot_docs(path) -> list[dict]:
    """The ChatbotService documents of an example file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "ChatbotService"]


def test_every_example_is_covered():
    assert len(EXAMPLES) >= 5 and all(chatbot_docs(p) for p in EXAMPLES)


WAVE = 2


def _ready(cluster, ns: str, name: str) -> bool:
    res = cluster.kubectl("get", "cbs", name, "-o", "json", namespace=ns, check=False)
    conds = {c["type"]: c for c in json.loads(res.stdout or "{}").get("status", {}).get("conditions", [])}
    return conds.get("Ready", {}).get("status") == "True"


def _pod_ready(pod: dict) -> bool:
    conds = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _serve_and_chat(cluster, ns: str, name: str) -> None:
    """Wait for Ready; check the pods are on the real node, on the CPU; chat through the Service."""
    t0 = time.monotonic()
    ok = wait_until(lambda: _ready(cluster, ns, name), 300, 0.5)
    print(f"[examples] {ns}/{name} Ready={ok} after {time.monotonic() - t0:.0f}s")
    pods_wide = cluster.kubectl("get", "pods", "-o", "wide", namespace=ns, check=False).stdout
    assert ok, f"{ns}/{name} never turned Ready on the real node:\n{pods_wide}"
    pods = json.loads(cluster.kubectl("get", "pods", "-o", "json", namespace=ns).stdout)["items"]
    # every scheduled pod is on the real node; a pod the scheduler has not placed yet (e.g. a rolling
    # update's surge pod waiting for the CPU the previous wave's draining pods still hold) is on none
    assert all(p["spec"].get("nodeName") in (None, "chatfleet-real-0") for p in pods), pods_wide
    ready = [p for p in pods if _pod_ready(p)]
    assert ready and all(p["spec"]["nodeName"] == "chatfleet-real-0" for p in ready), pods_wide
    log = cluster.kubectl("logs", ready[0]["metadata"]["name"], "-c", "triton", namespace=ns).stdout
    assert "simulated GPU" in log, log[-2000:]
    url = service_url(cluster, ns, name)
    # Ready pods and endpoints come before kube-proxy has written the Service's rules (its sync runs on
    # its own period): a refused connection right after Ready is retried for a bounded time, nothing else
    wait_until(lambda: chat_once(url, stream=False) != "conn", 30, 1)
    outcomes = [chat_once(url, stream=s) for s in (False, True)]
    assert outcomes == ["ok", "ok"], f"{ns}/{name} through {url}: {outcomes}"


def _gauge(ip: str, name: str) -> float | None:
    """One of the chat API's gauges, from the pod's scrape port (what Prometheus reads)."""
    try:
        with urllib.request.urlopen(f"http://{ip}:8090/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{")), None)


def _fallback_follows_the_spec(cluster, ns: str, name: str, doc: dict) -> None:
    """spec.fallback reaches the running pod (the operator's annotation, kubelet's downward API file, the
    chat API's re-read), and a change of it reaches the same pod: no restart, no new template, no release."""
    failures = doc["spec"]["fallback"]["breaker"]["failures"]
    pods = json.loads(cluster.kubectl("get", "pods", "-o", "json", namespace=ns).stdout)["items"]
    pod = next(p for p in pods if _pod_ready(p))
    ip, restarts = pod["status"]["podIP"], sum(c["restartCount"] for c in pod["status"]["containerStatuses"])
    threshold = "chatfleet_breaker_failure_threshold"
    assert wait_until(lambda: _gauge(ip, threshold) == failures, 120, 0.5), _gauge(ip, threshold)
    assert _gauge(ip, "chatfleet_fallback_faq_entries") == len(doc["spec"]["fallback"]["faq"])
    generation = cluster.kubectl(
        "get", "deployment", name, "-o", "jsonpath={.metadata.generation}", namespace=ns
    ).stdout
    patch = {"spec": {"fallback": {"breaker": {"failures": failures + 2}}}}
    cluster.kubectl("patch", "cbs", name, "--type=merge", "-p", json.dumps(patch), namespace=ns)
    t0 = time.monotonic()
    ok = wait_until(lambda: _gauge(ip, threshold) == failures + 2, 150, 0.5)
    print(
        f"[examples] {ns}/{name}: spec.fallback changed, in force on the running pod after {time.monotonic() - t0:.0f}s"
    )
    assert ok, f"the running pod still has {_gauge(ip, threshold)} after 150 s"
    after = json.loads(
        cluster.kubectl("get", "pod", pod["metadata"]["name"], "-o", "json", namespace=ns).stdout
    )
    assert sum(c["restartCount"] for c in after["status"]["containerStatuses"]) == restarts
    assert (
        cluster.kubectl(
            "get", "deployment", name, "-o", "jsonpath={.metadata.generation}", namespace=ns
        ).stdout
        == generation
    ), "a spec.fallback change must not touch the pod template"
    deployments = cluster.kubectl("get", "deployments", "-o", "name", namespace=ns).stdout.split()
    assert deployments == [f"deployment.apps/{name}"], (
        f"a spec.fallback change started a release: {deployments}"
    )


@pytest.mark.timeout(1500)  # three waves of real Triton pods on two cores: each wave <= 2 x 300 s + 90 s
def test_examples_serve_a_chat_on_the_real_node(
    cluster, real_operator, runtime_image, host_model_dir, reaper
):
    for start in range(0, len(EXAMPLES), WAVE):
        created: list[tuple[str, str, dict]] = []
        try:
            for i, path in enumerate(EXAMPLES[start : start + WAVE], start):
                ns = f"real-ex{i}-{path.stem[:2]}"
                cluster.kubectl("create", "namespace", ns, check=False)
                for doc in chatbot_docs(path):
                    spec = on_real_node(doc["spec"], image=runtime_image, model_dir=host_model_dir)
                    cluster.kubectl(
                        "apply", "-f", "-", input=yaml.safe_dump({**doc, "spec": spec}), namespace=ns
                    )
                    created.append((ns, doc["metadata"]["name"], doc))
            for ns, name, doc in created:
                _serve_and_chat(cluster, ns, name)
                if "fallback" in doc["spec"]:
                    _fallback_follows_the_spec(cluster, ns, name, doc)
        finally:
            # The wave's namespaces go in the background (the session's reaper: its ChatbotServices first,
            # its pods waited for, then the namespace; at the session's end, an error naming any left), so
            # the next wave starts while these pods drain: its pods are scheduled as the draining ones free
            # their CPU requests. Waiting for each wave's deletion here cost 16-17 s a wave, measured.
            for ns in sorted({ns for ns, _, _ in created}):
                reaper.delete(ns)
