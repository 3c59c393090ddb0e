"""The status a ChatbotService shows before any operator wrote one: the CRD's default.

Test design: ChatbotServices are created on the real kube-apiserver with no operator running, then read
back by GET, by LIST and through a watch, as kstatus (Flux), `kubectl get` and the operator read them. A
status the operator writes replaces the default.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

DEFAULT = {"observedGeneration": 0, "phase": "Pending"}


def create(cluster, namespace: str, tmp_path, name: str) -> dict:
    """POST a ChatbotService (no operator runs in this layer); the object the API server answers."""
    body = {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"uri": "hf://org/model"}},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return json.loads(cluster.kubectl("create", "-o", "json", "-f", str(path)).stdout)


def kstatus_in_progress(body: dict) -> bool:
    """kstatus' generic rule for a custom resource: InProgress while status.observedGeneration is present
    and differs from metadata.generation (or Reconciling is True); with neither it reads Current."""
    status = body.get("status") or {}
    observed = status.get("observedGeneration")
    reconciling = any(
        c.get("type") == "Reconciling" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return (observed is not None and observed != body["metadata"]["generation"]) or reconciling


@pytest.mark.cluster
def test_a_new_chatbotservice_reads_pending_and_in_progress_until_the_operator_writes(
    crd_installed, namespace, tmp_path
):
    """Without the default a ChatbotService no operator has seen has no status, which kstatus reads as
    Current: a GitOps pipeline would take a fleet as ready before any pod existed."""
    created = create(crd_installed, namespace, tmp_path, "fresh")
    assert created.get("status") == DEFAULT
    got = json.loads(
        crd_installed.kubectl("get", "chatbotservice", "fresh", "-o", "json", namespace=namespace).stdout
    )
    assert got.get("status") == DEFAULT and kstatus_in_progress(got)
    listed = json.loads(
        crd_installed.kubectl("get", "chatbotservices", "-o", "json", namespace=namespace).stdout
    )
    assert [item.get("status") for item in listed["items"]] == [DEFAULT]
    columns = crd_installed.kubectl(
        "get", "chatbotservice", "fresh", "--no-headers", namespace=namespace
    ).stdout
    assert "Pending" in columns.split()


@pytest.mark.cluster
def test_a_watch_shows_the_default_and_the_operators_status_replaces_it(crd_installed, namespace, tmp_path):
    argv = [
        str(crd_installed.binaries.kubectl),
        "-n",
        namespace,
        "get",
        "chatbotservices",
        "--watch",
        "-o",
        "json",
    ]
    watch = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=crd_installed.env)
    try:
        create(crd_installed, namespace, tmp_path, "watched")
        first = json.loads(_one_object(watch))
        assert first.get("status") == DEFAULT
    finally:
        watch.kill()
        watch.wait()
    ready = {
        "observedGeneration": 1,
        "phase": "Ready",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Ready",
                "message": "serving",
                "observedGeneration": 1,
                "lastTransitionTime": "2026-12-06T00:00:00Z",
            }
        ],
    }
    crd_installed.kubectl(
        "patch", "chatbotservice", "watched", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": ready}), namespace=namespace,
    )  # fmt: skip
    got = json.loads(
        crd_installed.kubectl("get", "chatbotservice", "watched", "-o", "json", namespace=namespace).stdout
    )
    assert got["status"] == ready and not kstatus_in_progress(got)


def _one_object(proc: subprocess.Popen) -> str:
    """The first JSON object `kubectl get --watch -o json` prints (one pretty-printed object per event)."""
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.rstrip() == "}":
            return "".join(lines)
    raise AssertionError(f"the watch ended before an object: {''.join(lines)!r}")
