"""Cluster.delete_namespace: the order of its deletions (the API calls themselves run in the real-pod suites)."""

from __future__ import annotations

import subprocess

import pytest
from chatfleet_platform.cluster import Cluster

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
