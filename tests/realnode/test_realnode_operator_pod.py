"""The operator image, installed by the chart, runs in a real pod and reconciles a ChatbotService.

Test design: `helm install` of the chart with the locally built operator image, pinned to the real node.
The kubelet must run the pod and its liveness and readiness probes, and the operator must reach the API
server from inside the pod (https://10.96.0.1 through kube-proxy and the node's API forwarder), under the
chart's ServiceAccount. A ChatbotService on the simulated GPU nodes must then turn Ready: this operator is
the only one watching its namespace. The image built from the old operator/Dockerfile crash-looped here
with `ModuleNotFoundError: No module named 'chatfleet_runtime'`.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
import yaml
from chatfleet_platform.cluster.realnode import REAL_LABEL
from chatfleet_platform.common.config import REPO_ROOT, binaries
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CHART = REPO_ROOT / "charts" / "chatfleet-operator"


def helm(cluster, *args: str) -> subprocess.CompletedProcess:
    env = {**cluster.env, "HELM_CACHE_HOME": str(REPO_ROOT / ".work" / "helm-cache")}
    res = subprocess.run([str(binaries().helm), *args], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, f"helm {' '.join(args)}:\n{res.stdout}\n{res.stderr}"
    return res


def test_chart_installed_operator_pod_reconciles(cluster, chatfleet_crd, real_node, image_refs):
    repo, tag = image_refs["operator"]["ref"].rsplit(":", 1)
    system, watched = f"cfop-{uuid.uuid4().hex[:6]}", f"cfwatch-{uuid.uuid4().hex[:6]}"
    for ns in (system, watched):
        cluster.kubectl("create", "namespace", ns)
    try:
        helm(
            cluster, "install", "cf", str(CHART), "-n", system, "--skip-crds",
            "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=Never",
            "--set", "watch.scope=namespaces", "--set", f"watch.namespaces={{{watched}}}",
            "--set-string", f"nodeSelector.{REAL_LABEL.replace('.', chr(92) + '.')}=true",
            "--set", f"tolerations[0].key={REAL_LABEL}", "--set", "tolerations[0].operator=Exists",
            "--wait", "--timeout", "240s",
        )  # fmt: skip
        pods = json.loads(cluster.kubectl("get", "pods", "-o", "json", namespace=system).stdout)["items"]
        assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == "chatfleet-real-0"
        statuses = pods[0]["status"]["containerStatuses"]
        assert all(s["ready"] and s["restartCount"] == 0 for s in statuses), statuses
        bot = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": "bot"},
            "spec": {
                "model": {"uri": "hf://org/tiny"},
                "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "cpu": "1", "memory": "4Gi"},
            },
        }
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bot), namespace=watched)

        def ready() -> bool:
            res = cluster.kubectl("get", "cbs", "bot", "-o", "json", namespace=watched, check=False)
            conds = json.loads(res.stdout or "{}").get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        ok = wait_until(ready, 180, 2)
        log = cluster.kubectl("logs", pods[0]["metadata"]["name"], namespace=system, check=False).stdout
        assert ok, f"the operator pod did not reconcile the ChatbotService; its log:\n{log[-3000:]}"
    finally:
        subprocess.run(
            [str(binaries().helm), "uninstall", "cf", "-n", system, "--wait", "--timeout", "60s"],
            capture_output=True, env=cluster.env, timeout=120,
        )  # fmt: skip
        for ns in (system, watched):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
