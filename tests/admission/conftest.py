"""Admission corpus fixtures: the CRD installed once per session on the local platform."""

from __future__ import annotations

from pathlib import Path

import pytest

CRD = Path(__file__).resolve().parents[2] / "crds" / "chatfleet.io_chatbotservices.yaml"


@pytest.fixture(scope="session")
def crd_installed(cluster):
    """Apply the ChatbotService CRD and wait until it is served."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/chatbotservices.chatfleet.io", "--timeout=60s"
    )
    return cluster
