"""ChatbotService lifecycle on the local platform: create -> Ready on the right GPU nodes, spec change
rolls the Deployment, a pass with nothing to change writes nothing, drift is put back, delete collects.

Each test runs in its own namespace against the session's operator process.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from operator_it import chatbot, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

H100 = "NVIDIA-H100-80GB-HBM3"
EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
CHILD_KINDS = ("deployment", "service", "poddisruptionbudget", "horizontalpodautoscaler")
CONFIG = "triton.chatfleet.io/chat.config.pbtxt"


def triton_config(kube, deployment: str = "bot") -> str:
    """The chat model's config.pbtxt as the Deployment's pods get it (their template's annotation)."""
    return kube.get("deployment", deployment)["spec"]["template"]["metadata"]["annotations"][CONFIG]


def node_product(kube, node: str) -> str:
    """GPU product label of a node."""
    return kube.get("node", node)["metadata"]["labels"]["nvidia.com/gpu.product"]


def child_versions(kube, name: str) -> dict[str, str]:
    """resourceVersion of the ChatbotService and every owned object."""
    out = {"chatbotservice": kube.get("chatbotservice", name)["metadata"]["resourceVersion"]}
    for kind in CHILD_KINDS:
        for obj in kube.get(kind, selector=f"chatfleet.io/service={name}") or []:
            out[f"{kind}/{obj['metadata']['name']}"] = obj["metadata"]["resourceVersion"]
    return out


def test_create_becomes_ready_on_the_right_gpu_nodes(kube):
    kube.apply(chatbot("bot", resources={"gpuProduct": H100, "gpusPerReplica": 2}, scaling={"replicas": 2}))
    body = kube.wait_ready("bot")
    status = body["status"]
    assert status["observedGeneration"] == body["metadata"]["generation"]
    assert (status["phase"], status["readyReplicas"], status["gpus"]) == ("Ready", 2, 4)
    assert status["endpoint"] == f"http://bot.{kube.ns}.svc.cluster.local:8080"
    for ctype, expected in (("Ready", "True"), ("Reconciling", "False"), ("Stalled", "False")):
        cond = kube.condition("bot", ctype)
        assert cond["status"] == expected and cond["observedGeneration"] == 1 and cond["reason"]
    pods = kube.get("pods", selector="chatfleet.io/service=bot")
    assert len(pods) == 2
    assert {node_product(kube, p["spec"]["nodeName"]) for p in pods} == {H100}
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, "pods should spread across nodes"
    uid = body["metadata"]["uid"]
    assert kube.get("configmap", selector="chatfleet.io/service=bot") == []  # the config is in the template
    for kind in ("deployment", "service", "poddisruptionbudget"):
        (obj,) = kube.get(kind, selector="chatfleet.io/service=bot")
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    table = kube.cluster.kubectl("get", "chatbotservices", namespace=kube.ns).stdout
    assert "READY" in table and "True" in table and "Ready" in table
    assert kube.events("bot") == [], "no event when all is well"
    # The operator writes only the status: no bookkeeping annotations (kopf's change handlers kept the last
    # handled spec there, one more write per creation and per spec change).
    meta = kube.get("chatbotservice", "bot")["metadata"]
    assert not [k for k in meta.get("annotations") or {} if "operator.chatfleet.io" in k or "kopf" in k], meta


def test_spec_change_rolls_the_deployment(kube):
    # A new revision is a release (tests/e2e covers canary steps and analysis); one unanalysed 100% step
    # promotes it at once, so this test sees the new revision rolled onto the stable Deployment.
    at_once = {"canary": {"steps": [{"weight": 100, "pauseSeconds": 0, "analysis": False}]}}
    kube.apply(chatbot("bot", runtime={"maxNewTokens": 128}, rollout=at_once))
    first = kube.wait_ready("bot")["status"]
    kube.apply(chatbot("bot", runtime={"maxNewTokens": 200}, rollout=at_once))
    assert wait_until(lambda: kube.get("chatbotservice", "bot")["status"]["observedGeneration"] == 2, 30)
    body = kube.wait_ready("bot")
    assert wait_until(
        lambda: kube.get("chatbotservice", "bot")["status"].get("stableRevision") != first["stableRevision"],
        30,
    )
    assert '"200"' in triton_config(kube)
    revision = body["status"]["updateRevision"]
    assert wait_until(
        lambda: (
            {
                p["metadata"]["labels"]["chatfleet.io/revision"]
                for p in kube.get("pods", selector="chatfleet.io/service=bot")
            }
            == {revision}
        ),
        60,
    )


def test_scaling_does_not_make_a_revision(kube):
    kube.apply(chatbot("bot"))
    revision = kube.wait_ready("bot")["status"]["stableRevision"]
    kube.cluster.kubectl("scale", "chatbotservice/bot", "--replicas=3", namespace=kube.ns)
    assert wait_until(lambda: kube.get("chatbotservice", "bot")["status"].get("readyReplicas") == 3, 60)
    assert kube.get("chatbotservice", "bot")["status"]["stableRevision"] == revision


def test_a_pass_with_nothing_to_change_writes_nothing(kube, operator):
    kube.apply(chatbot("bot", scaling={"replicas": 2}))
    kube.wait_ready("bot")
    time.sleep(3)  # let late watch events settle
    before = child_versions(kube, "bot")
    # Poke the operator: a pod event triggers a pass over this ChatbotService.
    pod = kube.get("pods", selector="chatfleet.io/service=bot")[0]["metadata"]["name"]
    kube.cluster.kubectl("label", "pod", pod, "poke=1", namespace=kube.ns)
    time.sleep(3)
    assert child_versions(kube, "bot") == before


def test_owned_objects_edited_or_deleted_by_hand_are_put_back(kube):
    kube.apply(chatbot("bot"))
    kube.wait_ready("bot")
    image = kube.get("deployment", "bot")["spec"]["template"]["spec"]["containers"][0]["image"]
    kube.cluster.kubectl("set", "image", "deployment/bot", "triton=evil:1", namespace=kube.ns)
    kube.cluster.kubectl("delete", "service", "bot", namespace=kube.ns)
    good = triton_config(kube)
    kube.cluster.kubectl(
        "patch",
        "deployment",
        "bot",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"template": {"metadata": {"annotations": {CONFIG: "broken"}}}}}),
        namespace=kube.ns,
    )
    assert wait_until(
        lambda: kube.get("deployment", "bot")["spec"]["template"]["spec"]["containers"][0]["image"] == image,
        30,
    )
    assert wait_until(lambda: kube.get("service", "bot") is not None, 30)
    assert wait_until(lambda: triton_config(kube) == good, 30)


def test_autoscale_owns_an_hpa_and_turning_it_off_removes_it(kube):
    kube.apply(
        chatbot(
            "bot",
            scaling={"autoscale": {"minReplicas": 1, "maxReplicas": 3, "targets": {"inFlightRequests": 4}}},
        )
    )
    kube.wait_ready("bot")
    hpa = kube.get("horizontalpodautoscaler", "bot")
    assert (
        hpa["spec"]["maxReplicas"] == 3 and hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "4"
    )
    kube.apply(chatbot("bot", scaling={"replicas": 1}))
    assert wait_until(lambda: kube.get("horizontalpodautoscaler", "bot") is None, 30)


def test_a_pdb_only_while_more_than_one_pod_can_run(kube):
    kube.apply(chatbot("bot", scaling={"replicas": 2}))
    kube.wait_ready("bot")
    assert kube.get("poddisruptionbudget", "bot")["spec"]["maxUnavailable"] == 1
    kube.apply(chatbot("bot", scaling={"replicas": 1}))  # one pod: maxUnavailable 1 would allow any eviction
    assert wait_until(lambda: kube.get("poddisruptionbudget", "bot") is None, 30)
    kube.wait_ready("bot")


def test_delete_collects_the_children(kube):
    kube.apply(chatbot("bot", scaling={"replicas": 2}))
    kube.wait_ready("bot")
    kube.cluster.kubectl("delete", "chatbotservice", "bot", "--wait=true", "--timeout=30s", namespace=kube.ns)
    for kind in ("deployment", "service", "poddisruptionbudget"):
        assert wait_until(lambda kind=kind: kube.get(kind, selector="chatfleet.io/service=bot") == [], 60), (
            kind
        )


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_become_ready(kube, example):
    docs = list(yaml.safe_load_all(example.read_text()))
    kube.apply(*docs)
    for doc in docs:
        if doc["kind"] == "ChatbotService":
            body = kube.wait_ready(doc["metadata"]["name"], timeout=90)
            product = doc["spec"].get("resources", {}).get("gpuProduct")
            if product:
                pods = kube.get("pods", selector=f"chatfleet.io/service={doc['metadata']['name']}")
                assert {node_product(kube, p["spec"]["nodeName"]) for p in pods} == {product}
            assert body["status"]["phase"] == "Ready"
