"""The operator image, installed by the chart, runs in a real pod, reconciles, and is upgraded by helm.

Test design: `helm install` of the chart with the locally built operator image, pinned to the real node,
its cluster defaults (`operator.defaults.runtimeImage`, `.prometheusAddress`) set from values. The kubelet
must run the pod and its liveness and readiness probes, and the operator must reach the API server from
inside the pod (https://10.96.0.1 through kube-proxy and the node's API forwarder), under the chart's
ServiceAccount. ChatbotServices on the simulated GPU nodes must then turn Ready: this operator is the only
one watching its namespace. The image built from the old operator/Dockerfile crash-looped here with
`ModuleNotFoundError: No module named 'chatfleet_runtime'`.

Then `helm upgrade` changes only `operator.defaults.runtimeImage`, as an operator upgrade that ships a new
runtime does. A fleet that names no image must move to the new one through a canary release judged by
the analysis (a real Prometheus scraping a trafficsim for its tracks, reached by the operator pod on the
node's address through a forwarder, as the API server is); a fleet that names its own image must keep it
and start no release.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from chatfleet_platform.addons.operatorchart import OperatorChart, image_values, real_node_values
from chatfleet_platform.common import procs
from chatfleet_platform.load.trafficsim import TrafficSim
from chatfleet_platform.servers import services
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

#: The runtime images the two operator versions default to (the fleets run on kwok nodes: never pulled).
FIRST, SECOND = "registry.example/chatfleet-runtime:1.0", "registry.example/chatfleet-runtime:1.1"
FAST_CANARY = {
    "strategy": "canary",
    "canary": {"steps": [{"weight": 50, "pauseSeconds": 2}, {"weight": 100, "pauseSeconds": 0}]},
}


@dataclass
class Installed:
    """The chart's release (`chart`), watching `watched`; a trafficsim for the fleet `follows`."""

    cluster: object
    chart: OperatorChart
    watched: str
    traffic: TrafficSim
    prometheus: services.Prometheus

    def operator_pods(self) -> list[dict]:
        return self.chart.pods()

    def operator_log(self) -> str:
        return self.chart.log()

    def apply(self, name: str, **spec_over) -> None:
        spec = {
            "model": {"uri": "hf://org/tiny"},
            "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "cpu": "1", "memory": "4Gi"},
            **spec_over,
        }
        bot = {"apiVersion": "chatfleet.io/v1alpha1", "kind": "ChatbotService", "metadata": {"name": name}}
        self.cluster.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump({**bot, "spec": spec}), namespace=self.watched
        )

    def get(self, kind: str, name: str) -> dict:
        res = self.cluster.kubectl("get", kind, name, "-o", "json", namespace=self.watched, check=False)
        return json.loads(res.stdout or "{}")

    def ready(self, name: str) -> bool:
        conds = self.get("cbs", name).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def images(self, name: str) -> set[str]:
        containers = self.get("deployment", name).get("spec", {}).get("template", {}).get("spec", {})
        return {c["image"] for c in containers.get("containers", [])}

    def events(self, name: str) -> list[str]:
        res = self.cluster.kubectl(
            "get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json",
            namespace=self.watched, check=False,
        )  # fmt: skip
        return [e["reason"] for e in json.loads(res.stdout or "{}").get("items", [])]


@pytest.fixture(scope="module")
def installed(cluster, chatfleet_crd, real_node, image_refs, tmp_path_factory) -> Iterator[Installed]:
    """The chart installed once for this module, its defaults from values (and torn down after)."""
    system, watched = f"cfop-{uuid.uuid4().hex[:6]}", f"cfwatch-{uuid.uuid4().hex[:6]}"
    for ns in (system, watched):
        cluster.kubectl("create", "namespace", ns)
    traffic = TrafficSim(watched, "follows").start()
    prometheus = services.Prometheus(
        tmp_path_factory.mktemp("chart-prometheus"), targets=[traffic.target]
    ).start()
    # the operator pod reaches this host's Prometheus on the node's address (its own bridge, never off the
    # machine), as it reaches the API server; the chart's default address names a cluster Service instead
    port = procs.free_port()
    forward = subprocess.Popen(
        ["socat", f"TCP-LISTEN:{port},bind={real_node.ip},reuseaddr,fork", f"TCP:127.0.0.1:{prometheus.port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    chart = OperatorChart(cluster, system)
    try:
        chart.install([
            *image_values(image_refs["operator"]["ref"]), *real_node_values(),
            "--set", "watch.scope=namespaces", "--set", f"watch.namespaces={{{watched}}}",
            "--set", f"operator.defaults.runtimeImage={FIRST}",
            "--set", f"operator.defaults.prometheusAddress=http://{real_node.ip}:{port}",
            "--set", f"operator.analysisAllowedHosts={{{real_node.ip}}}",
        ])  # fmt: skip
        yield Installed(cluster, chart, watched, traffic, prometheus)
    finally:
        chart.uninstall()
        forward.terminate()
        forward.wait(10)
        prometheus.stop()
        traffic.stop()
        for ns in (system, watched):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_chart_installed_operator_pod_reconciles(installed):
    pods = installed.operator_pods()
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == "chatfleet-real-0"
    statuses = pods[0]["status"]["containerStatuses"]
    assert all(s["ready"] and s["restartCount"] == 0 for s in statuses), statuses
    installed.apply("bot")
    ok = wait_until(lambda: installed.ready("bot"), 180, 0.5)
    assert ok, f"the operator pod did not reconcile the ChatbotService; its log:\n{installed.operator_log()}"
    assert installed.images("bot") == {FIRST}, "the runtime image comes from the chart's value"


def prometheus_queries(prometheus: services.Prometheus) -> float:
    """How many instant and range queries this Prometheus has answered (its own /metrics)."""
    with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query' in line
    )


def test_helm_upgrade_with_a_new_default_image_releases_the_fleets_that_follow_it(installed):
    """The operator upgrade's new runtime reaches a running fleet through a canary release (judged by
    the analysis, then promoted); a fleet with its own image is left alone."""
    installed.traffic.healthy(20)
    installed.apply("follows", rollout=FAST_CANARY, analysis={"intervalSeconds": 2, "failureLimit": 2})
    installed.apply("pinned", runtime={"image": "registry.example/mine:1"})
    assert wait_until(lambda: installed.ready("follows") and installed.ready("pinned"), 180, 0.5), (
        installed.operator_log()
    )
    assert installed.images("follows") == {FIRST} and installed.images("pinned") == {
        "registry.example/mine:1"
    }
    assert "image" not in (installed.get("cbs", "follows")["spec"].get("runtime") or {}), "no default stored"
    first = {n: installed.get("cbs", n)["status"]["stableRevision"] for n in ("follows", "pinned")}
    queried = prometheus_queries(installed.prometheus)

    installed.chart.upgrade(["--set", f"operator.defaults.runtimeImage={SECOND}"])
    args = [a for p in installed.operator_pods() for a in p["spec"]["containers"][0]["args"]]
    assert f"--runtime-image={SECOND}" in args, args

    def promoted() -> str | None:
        status = installed.get("cbs", "follows").get("status", {})
        rev = status.get("stableRevision")
        return rev if rev != first["follows"] and not status.get("release") else None

    new = wait_until(promoted, 240, 0.5)
    assert new, (
        f"no promotion of a new revision; status {installed.get('cbs', 'follows').get('status')}\n"
        + (installed.operator_log())
    )
    assert installed.images("follows") == {SECOND}
    history = installed.get("cbs", "follows")["status"]["releaseHistory"]
    assert history[0]["revision"] == new and history[0]["result"] == "Promoted", history
    assert {"ReleaseStarted", "ReleasePromoted"} <= set(installed.events("follows"))
    assert prometheus_queries(installed.prometheus) > queried, "the release's analysis asked Prometheus"
    # the pinned fleet: same revision, same image, no release
    pinned = installed.get("cbs", "pinned")["status"]
    assert pinned["stableRevision"] == first["pinned"] and not pinned.get("releaseHistory")
    assert installed.images("pinned") == {"registry.example/mine:1"}
