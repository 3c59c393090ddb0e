"""Fixtures for tests on real pods: one real node joined to the session cluster, the project's images in it,
the tiny model on the host, the operator, and a Prometheus that finds the pods through the Kubernetes API
with the chart's own PodMonitor relabelling.

The real node joins lazily (when the first test here asks for it), so the simulated suites before this
layer never see it. It is tainted anyway: only pods that tolerate chatfleet.io/real-node land there.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chatfleet_platform.addons import scrape
from chatfleet_platform.addons.gateway import GATEWAY_NAME, SHARED_NAMESPACE
from chatfleet_platform.cluster import images
from chatfleet_platform.cluster.cluster import NamespaceReaper
from chatfleet_platform.cluster.realnode import NodePlan
from chatfleet_platform.common.config import CHATBOT_CRD_NAME, REAL_NODE_OPERATOR_ENV, REPO_ROOT
from chatfleet_platform.load.realpods import fleet_podmonitor
from chatfleet_platform.servers import services
from operator_process import OperatorProcess

#: Namespaces the real-pod operator watches (the other suites' operators leave them alone).
REAL_NAMESPACES = "real-*"

#: Tests of a real node's own life on a scratch cluster: they run first, before the session's real node
#: joins (only one cluster per host may run real nodes).
FIRST = "test_realnode_lifecycle.py"
#: The node-loss drill runs last: it kills the session's kubelet and starts it again.
LAST = "test_realnode_node_loss.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the real node's life-cycle tests first and the node-loss drill last (a stable sort: the others
    keep their order)."""
    items.sort(key=lambda item: (item.path.name != FIRST) + (item.path.name == LAST))


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the layer's time went: its Bot.waits, the longest first (all of them in realnode-waits.json)."""
    from chatfleet_platform.load.releasetraffic import WAITS

    if not WAITS:
        return
    out = REPO_ROOT / ".work" / "test-results" / "realnode-waits.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(WAITS, indent=1))
    total = sum(w["seconds"] for w in WAITS)
    terminalreporter.write_sep("=", f"{len(WAITS)} waits on the cluster, {total:.0f} s; the longest")
    for w in sorted(WAITS, key=lambda w: -w["seconds"])[:15]:
        test = w["test"].rsplit("::", 1)[-1]
        terminalreporter.write_line(f"{w['seconds']:7.1f}s  {w['what'][:60]:<60}  {test[:70]}")


@pytest.fixture(scope="session")
def image_refs() -> dict[str, dict]:
    """The project's images (operator, runtime, pause), built from its Dockerfiles when missing or stale."""
    return images.ImageBuilder().build(list(images.ALL_NAMES))


@pytest.fixture(scope="session")
def real_node(cluster, image_refs) -> NodePlan:
    """One real node (kubelet + containerd, 8 fake GPUs) with the images imported."""
    (node,) = cluster.add_real_nodes(1, gpus=8)
    return node


@pytest.fixture(scope="session")
def runtime_image(image_refs) -> str:
    """The runtime image's content-addressed ref (imported into the real node)."""
    return image_refs["runtime"]["ref"]


@pytest.fixture(scope="session")
def host_model_dir() -> Path:
    """The tiny model on the host, readable by the pods' non-root user (mounted with model.hostPath)."""
    from chatfleet_platform.cluster.realnode import readable_by_pods
    from chatfleet_platform.localruntime.tiny import build_tiny_model

    return readable_by_pods(build_tiny_model(REPO_ROOT / ".work" / "realnode-model"))


@pytest.fixture(scope="session")
def real_operator(chatfleet_crd, real_node, tmp_path_factory) -> Iterator[OperatorProcess]:
    """The operator (a host process, like the other suites') watching real-* namespaces.

    Its HTTPRoutes attach to the `gateway` fixture's shared Gateway whenever a module has one up.
    """
    # Traefik 3.6 mirrors a release's shadow traffic by TraefikService (it lacks Gateway API's RequestMirror)
    gateway_args = (
        f"--gateway={GATEWAY_NAME}",
        f"--gateway-namespace={SHARED_NAMESPACE}",
        "--gateway-mirror=TraefikService",
        # Services behind its HTTPRoutes even while test_realnode_pools.py has the InferencePool CRD in:
        # that module's own operator (pool-* namespaces) routes through pools
        "--routing=Service",
    )
    op = OperatorProcess(
        chatfleet_crd,
        tmp_path_factory.mktemp("real-operator"),
        (REAL_NAMESPACES,),
        gateway_args,
        env=REAL_NODE_OPERATOR_ENV,
    )
    with op.running():
        yield op


@pytest.fixture(autouse=True)
def operator_alive(request) -> None:
    """A test that uses the session's operator fails at once if that process has exited, naming its log's
    end (a dead operator would leave each later test waiting out its own timeouts, minutes each)."""
    if "real_operator" not in request.fixturenames:
        return
    op = request.getfixturevalue("real_operator")
    if op.proc is None or op.proc.poll() is not None:
        pytest.fail(f"the real-pod suite's operator has exited; its log ends:\n{op.log_text()[-4000:]}")


@pytest.fixture(scope="session")
def pod_prometheus(cluster, real_node, tmp_path_factory) -> Iterator[services.Prometheus]:
    """A real Prometheus discovering pods through the API, relabelled as the chart's PodMonitor says."""
    configs = scrape.podmonitor_scrape_configs(
        fleet_podmonitor(), api_server=cluster.server, pki_dir=cluster.workdir / "pki", scrape_interval="1s"
    )
    prom = services.Prometheus(tmp_path_factory.mktemp("pod-prometheus"), scrape_configs=configs).start()
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture(scope="session")
def reaper(cluster) -> Iterator[NamespaceReaper]:
    """The session's background namespace deletions (the next test starts while the last one's pods drain,
    and the scheduler holds back what their CPU still needs); at the end, an error naming any left."""
    r = NamespaceReaper(cluster, first=[CHATBOT_CRD_NAME])
    yield r
    left = r.finish()
    assert not left, "\n".join(f"{ns} was not deleted:\n{what_holds(cluster, ns)}" for ns in left)


def what_holds(cluster, ns: str) -> str:
    """Why a namespace outlives its deletion: its pods, the ChatbotServices' finalizers, the last events."""
    out = [cluster.kubectl("get", "pods,cbs", "-o", "wide", namespace=ns, check=False).stdout]
    out.append(cluster.kubectl("get", "ns", ns, "-o", "jsonpath={.status}", check=False).stdout)
    out.append(
        cluster.kubectl(
            "get", "cbs", "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.finalizers}{\"\\n\"}{end}",
            namespace=ns, check=False,
        ).stdout
    )  # fmt: skip
    out.append(
        cluster.kubectl("get", "events", "--sort-by=.lastTimestamp", namespace=ns, check=False).stdout[-3000:]
    )
    return "\n".join(out)


def new_real_ns(cluster) -> str:
    """A fresh real-* namespace whose default ServiceAccount exists."""
    name = f"real-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    assert services.wait_until(
        lambda: cluster.kubectl("get", "sa", "default", namespace=name, check=False).returncode == 0, 30
    )
    return name


@pytest.fixture
def real_ns(cluster, real_node, reaper) -> Iterator[str]:
    """A fresh real-* namespace; deleted afterwards in the background (`reaper`)."""
    name = new_real_ns(cluster)
    try:
        yield name
    finally:
        reaper.delete(name)


@dataclass
class HeadStart:
    """A namespace whose bot is applied when its module starts, for a later test of that module: the bot's
    pod starts while the tests before it run (a real pod's start is some 12 s of a test's waiting). The test
    takes it (`ahead_ns`) and waits for its bot to be Ready as any test does; it is deleted in the background
    after that test, or when the module ends if no test took it."""

    cluster: Any
    reaper: NamespaceReaper
    ns: str = ""

    def begin(self, prepare: Callable[[str], None]) -> None:
        """A new namespace, prepare(namespace) run in it (apply the bot and whatever it names)."""
        self.ns = new_real_ns(self.cluster)
        prepare(self.ns)

    def end(self) -> None:
        if self.ns:
            self.reaper.delete(self.ns)
            self.ns = ""


@pytest.fixture(scope="module")
def head_start(cluster, real_node, reaper) -> Iterator[HeadStart]:
    """The module's head start (a module fixture of its own, autouse, calls `begin`)."""
    hs = HeadStart(cluster, reaper)
    yield hs
    hs.end()


@pytest.fixture
def ahead_ns(head_start) -> Iterator[str]:
    """The namespace of the module's head start, its bot applied when the module began."""
    assert head_start.ns, "no head start in this module (its autouse fixture calls head_start.begin)"
    yield head_start.ns
    head_start.end()


@dataclass
class PodRedis:
    """A Redis the real node's pods reach: it listens on 127.0.0.1 and on the node's bridge address only."""

    server: services.Redis
    node_ip: str
    cluster: Any

    @property
    def url(self) -> str:
        """redis://<node IP>:<port>/0: the address pods on the real node dial."""
        return self.server.url_at(self.node_ip)

    @property
    def host_url(self) -> str:
        """redis://127.0.0.1:<port>/0: the same server, from this host (tests reading what pods wrote)."""
        return self.server.url

    def secret(self, namespace: str, name: str = "redis") -> dict[str, str]:
        """Secret `name` in `namespace` with key `url` = self.url; returns spec.runtime.sessions.redis for it."""
        self.cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "namespace": namespace},
                    "type": "Opaque",
                    "stringData": {"url": self.url},
                }
            ]
        )
        return {"secretName": name, "key": "url"}


@pytest.fixture(scope="session")
def pod_redis(cluster, real_node, tmp_path_factory) -> Iterator[PodRedis]:
    """A real redis-server on 127.0.0.1 and the real node's bridge address, for the session.

    `pod_redis.secret(ns)` writes Secret `redis` (key `url`) into ns and returns the
    `spec.runtime.sessions.redis` that names it; `pod_redis.url` is redis://<node IP>:<port>/0.
    """
    server = services.Redis(tmp_path_factory.mktemp("pod-redis"), also_bind=(real_node.ip,)).start()
    try:
        yield PodRedis(server, real_node.ip, cluster)
    finally:
        server.stop()
