"""Cluster.delete_namespace and the NamespaceReaper: the order of their deletions (the API calls themselves run
in the real-pod suites); the controller manager's node grace."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from chatfleet_platform.cluster.cluster import Cluster, NamespaceReaper
from chatfleet_platform.common.config import Binaries

pytestmark = pytest.mark.harness


class RecordingCluster(Cluster):
    """A Cluster whose kubectl records its arguments instead of running."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[tuple[str | None, tuple[str, ...]]] = []

    def kubectl(self, *args: str, namespace: str | None = None, **_: object) -> subprocess.CompletedProcess:
        self.calls.append((namespace, args))
        return subprocess.CompletedProcess(args, 1, "", "error: the server doesn't have a resource type")


def test_a_namespace_is_emptied_of_its_custom_resources_then_workloads_before_it_is_deleted(tmp_path):
    """The namespace controller waits out the grace period of pods it finds terminating; the workloads go
    first and are waited for, so the namespace finds none. A failed step does not stop the next."""
    cluster = RecordingCluster(tmp_path)
    cluster.delete_namespace("real-1", first=["chatbotservices.chatfleet.io"], timeout=30)
    wait = ("--wait=true", "--timeout=30s")
    assert cluster.calls == [
        ("real-1", ("delete", "chatbotservices.chatfleet.io", "--all", *wait)),
        ("real-1", ("delete", "deployments,statefulsets,replicasets,pods", "--all", *wait)),
        (None, ("delete", "namespace", "real-1", *wait)),
    ]


class StayingCluster(RecordingCluster):
    """A RecordingCluster in which namespace `stays` is still there after its deletion."""

    stays = "real-2"

    def kubectl(self, *args: str, namespace: str | None = None, **kw: object) -> subprocess.CompletedProcess:
        res = super().kubectl(*args, namespace=namespace, **kw)
        if args[:3] == ("get", "namespace", self.stays):
            return subprocess.CompletedProcess(args, 0, f"namespace/{self.stays}", "")
        return res


def test_the_reaper_deletes_each_namespace_as_delete_namespace_does_and_names_those_left(tmp_path):
    cluster = StayingCluster(tmp_path)
    reaper = NamespaceReaper(cluster, first=["chatbotservices.chatfleet.io"])
    reaper.delete("real-1")
    reaper.delete("real-2")
    assert reaper.finish() == ["real-2"]
    for ns in ("real-1", "real-2"):
        mine = [args for where, args in cluster.calls if where == ns or ns in args]
        assert [args[:2] for args in mine] == [
            ("delete", "chatbotservices.chatfleet.io"),
            ("delete", "deployments,statefulsets,replicasets,pods"),
            ("delete", "namespace"),
            ("get", "namespace"),
        ], mine


def test_the_node_controller_waits_as_long_as_the_simulated_nodes_lease():
    """kwok renews a node's lease every quarter of it; with thousands of nodes on a saturated machine the
    renewals fall behind, so a bench that lengthens the lease needs the node controller to wait as long
    before it marks the nodes' pods NotReady (kwok never makes them Ready again)."""
    cluster = Cluster(Path("/nonexistent"))
    bins = Binaries(**{name: Path(f"/bin/{name}") for name in Binaries.__dataclass_fields__})
    ports = {"controller_manager": 1}

    def grace(*lease: int) -> list[str]:
        args = cluster._kcm_args(bins, ports, Path("/pki"), 15, *lease)
        return [a for a in args if a.startswith("--node-monitor-grace-period")]

    assert grace() == ["--node-monitor-grace-period=50s"]  # the default lease: the controller's default
    assert grace(240) == ["--node-monitor-grace-period=240s"]


def test_the_api_servers_audit_of_lists_and_watches_is_asked_for_by_a_bench_only(tmp_path, monkeypatch):
    """CHATFLEET_APISERVER_AUDIT_LOG names the file where the API server writes who listed and watched
    what (to find the client that watches again and again at ten thousand objects); the policy audits
    lists and watches only, and without the variable nothing is audited."""
    cluster = Cluster(tmp_path)
    bins = Binaries(**{name: Path(f"/bin/{name}") for name in Binaries.__dataclass_fields__})
    ports = {"etcd_client": 1, "apiserver": 2}

    def audit() -> list[str]:
        return [a for a in cluster._apiserver_args(bins, ports, Path("/pki")) if a.startswith("--audit")]

    monkeypatch.delenv("CHATFLEET_APISERVER_AUDIT_LOG", raising=False)
    assert audit() == []
    monkeypatch.setenv("CHATFLEET_APISERVER_AUDIT_LOG", str(tmp_path / "audit.log"))
    policy = tmp_path / "audit-policy.yaml"
    assert audit() == [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={tmp_path / 'audit.log'}",
        "--audit-log-maxbackup=0",
    ]
    rules = yaml.safe_load(policy.read_text())["rules"]
    assert rules == [{"level": "Metadata", "verbs": ["list", "watch"]}, {"level": "None"}]
