"""Shared fixtures: the local platform (one cluster per test session), namespaces, Redis and Prometheus.

The cluster starts only when a test asks for it, lives in .work/test-cluster-<pid> (ports picked free, so
a `make cluster-up` cluster and other test sessions can run beside it) and is torn down at the end of the
session, also when tests fail. Folders left by sessions that died are cleaned up (their processes stopped)
by the next session. Binaries are built on first use if `make platform-build` has not run.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from chatfleet_platform.addons import gatewayapi, traefikcrd
from chatfleet_platform.addons.gateway import Gateway
from chatfleet_platform.addons.keda import Keda, keda_binaries
from chatfleet_platform.cluster.cluster import Cluster
from chatfleet_platform.common.config import (
    BUILD_SCRIPT,
    CHATBOT_CRD_FILE,
    CHATBOT_CRD_NAME,
    GATEWAY_BINARIES,
    REPO_ROOT,
    PlatformError,
    binaries,
)
from chatfleet_platform.servers import services
from needs import pytest_runtest_makereport  # noqa: F401 - any skip is reported as a failure
from teardown import sigint_deferred

WORK = REPO_ROOT / ".work"


def _progress(msg: str) -> None:
    print(f"[platform] {msg}", flush=True)


def _sweep_stale_clusters() -> None:
    """Stop and remove clusters of test sessions whose pytest process is gone."""
    for folder in WORK.glob("test-cluster-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            Cluster(folder).down()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running local cluster with 4 simulated GPU nodes (kubeconfig, kubectl, env)."""
    if binaries().missing():
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True)
    _sweep_stale_clusters()
    c = Cluster(WORK / f"test-cluster-{os.getpid()}", progress=_progress)
    try:
        c.up(nodes=4)
        yield c
    finally:
        with sigint_deferred():  # an interrupt mid-way left the cluster and its real node running
            c.down()


@pytest.fixture(scope="session")
def keda(cluster: Cluster) -> Iterator[Keda]:
    """KEDA (operator + metrics adapter behind v1beta1.external.metrics.k8s.io) on the session's cluster."""
    from needs import missing

    try:
        keda_binaries()
    except PlatformError:  # built on first use, like the cluster's binaries
        subprocess.run(["bash", str(BUILD_SCRIPT), "keda"], check=False)
    try:
        keda_binaries()
    except PlatformError as exc:
        missing("KEDA", f"{exc}; `make setup` builds it")
    k = Keda(cluster)
    k.up()
    try:
        yield k
    finally:
        k.down()


@pytest.fixture(scope="module")
def gateway(cluster: Cluster) -> Iterator[Gateway]:
    """Traefik serving Gateway `chatfleet` in `chatfleet-gateway` (routes from every namespace).

    `gateway.url` is where requests go (http://127.0.0.1:<port>); an HTTPRoute attaches with parentRefs
    [{name: gateway.name, namespace: gateway.namespace}]; `gateway.add(ns)` puts a Gateway `chatfleet` in
    `ns` too. For the tests of one module: it installs the Gateway API CRDs (the operators' discovery then
    finds gateway.networking.k8s.io, and releases move traffic with HTTPRoutes) and deletes them again
    afterwards, so the modules after it keep the replica-ratio mode they expect.
    """
    from needs import missing

    if binaries().missing(GATEWAY_BINARIES):  # built on first use, like the cluster's binaries
        subprocess.run(["bash", str(BUILD_SCRIPT), "traefik"], check=False)
    if binaries().missing(GATEWAY_BINARIES):
        missing("Traefik", f"not built under {binaries().traefik.parent}; `make platform-build` builds it")
    g = Gateway(cluster)
    g.up()
    try:
        yield g
    finally:
        g.down()
        gatewayapi.uninstall(cluster)
        traefikcrd.uninstall(cluster)


@pytest.fixture(scope="session")
def chatfleet_crd(cluster: Cluster) -> Cluster:
    """The cluster with the ChatbotService CRD applied and Established."""
    cluster.install_crd(CHATBOT_CRD_FILE, CHATBOT_CRD_NAME)
    return cluster


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists; deleted afterwards (not waited for)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    assert services.wait_until(
        lambda: cluster.kubectl("get", "sa", "default", namespace=name, check=False).returncode == 0, 30
    ), f"default ServiceAccount never appeared in {name}"
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> Iterator[services.Redis]:
    """A real redis-server on 127.0.0.1 for the whole session."""
    with services.Redis(tmp_path_factory.mktemp("redis")) as r:
        yield r


@pytest.fixture
def make_prometheus(tmp_path: Path):
    """Factory: start a real Prometheus scraping the given targets; stopped after the test."""
    started: list[services.Prometheus] = []

    def make(targets=(), scrape_configs=None, scrape_interval="1s") -> services.Prometheus:
        p = services.Prometheus(
            tmp_path / f"prometheus-{len(started)}",
            targets=targets,
            scrape_configs=scrape_configs or [],
            scrape_interval=scrape_interval,
        ).start()
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()
