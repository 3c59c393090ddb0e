"""Admission corpus fixtures: the CRD installed once per session on the local platform."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

CRD = Path(__file__).resolve().parents[2] / "crds" / "chatfleet.io_chatbotservices.yaml"


@pytest.fixture(scope="session")
def crd_installed(cluster):
    """Apply the ChatbotService CRD and wait until it is served."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    for _ in range(120):  # right after the apply the CRD may have no status yet: kubectl wait then errors
        res = cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/chatbotservices.chatfleet.io",
            "--timeout=30s",
            check=False,
        )
        if res.returncode == 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"CRD not Established: {res.stderr}")
    return cluster
