"""End-to-end release fixtures: the CRD, one operator for e2e-* namespaces, trafficsim + Prometheus.

The operator runs as a subprocess (like tests/integration/operator) but watches only namespaces named
e2e-*, which the integration operator leaves alone, so both suites can share one session cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from chatfleet_platform.load.trafficsim import TrafficSim
from chatfleet_platform.servers import services
from operator_process import OperatorProcess
from release_e2e import Release, wait_until

E2E_NAMESPACES = "e2e-*"


@pytest.fixture(scope="session")
def release_operator(chatfleet_crd, tmp_path_factory) -> Iterator[OperatorProcess]:
    """One operator for e2e-* namespaces (the CRD comes from the shared chatfleet_crd fixture)."""
    cluster = chatfleet_crd
    op = OperatorProcess(cluster, tmp_path_factory.mktemp("release-operator"), (E2E_NAMESPACES,))
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def e2e_namespace(cluster) -> Iterator[str]:
    """A fresh e2e-* namespace (deleted afterwards, not waited for)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    assert wait_until(
        lambda: cluster.kubectl("get", "sa", "default", namespace=name, check=False).returncode == 0, 30
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def traffic(e2e_namespace) -> Iterator[TrafficSim]:
    """A trafficsim for the ChatbotService `bot`, healthy traffic on stable and canary."""
    sim = TrafficSim(e2e_namespace, "bot").start()
    sim.healthy(20)
    sim.set("preview", rps=20, error_rate=0.002, latency_ms=120, ttft_ms=40)
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def prometheus(make_prometheus, traffic) -> services.Prometheus:
    """A real Prometheus scraping the trafficsim every second."""
    return make_prometheus(targets=[traffic.target])


@pytest.fixture
def bot(release_operator, e2e_namespace, cluster) -> Release:
    """The ChatbotService `bot` in the test's namespace (not created yet)."""
    return Release(cluster, e2e_namespace, "bot")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[Any]:
    """A failed e2e test's report carries the shared operator's log lines about its namespace."""
    report = yield
    op = getattr(item, "funcargs", {}).get("release_operator")
    ns = getattr(item, "funcargs", {}).get("e2e_namespace")
    if report.failed and isinstance(op, OperatorProcess) and ns and op.log.exists():
        lines = op.log.read_text(errors="replace").splitlines()
        mine = [line for line in lines if ns in line] or lines
        alive = op.proc is not None and op.proc.poll() is None
        report.sections.append(
            (f"operator log ({'running' if alive else 'exited'}), lines naming {ns}", "\n".join(mine[-80:]))
        )
    return report
