"""The real HPA controller scales a ChatbotService up and down through KEDA on a per-pod runtime metric.

Test design: the session's cluster runs KEDA (the `keda` fixture: its operator and metrics adapter behind
the external metrics APIService). An operator process of its own watches keda-* namespaces with the
autoscaler discovered (the suite's operator is pinned to HPAs), so it writes a ScaledObject. kwok pods
run no containers, so a small exporter here serves `chatfleet_inflight_requests{namespace,model,pod}`
for the ChatbotService's serving pods, and a real Prometheus scrapes it; the ScaledObject's Prometheus
trigger reads that Prometheus, KEDA's adapter serves the value, kube-controller-manager's HPA
controller decides, and writes spec.scaling.replicas through the scale subresource. Nothing here
writes a replica count.

The pods carry a simulated model-load delay (kwok stage, annotation sim.chatfleet.io/model-load-delay),
and a warm pool of one: on scale-up the standby pod joins the Service at once and the pool refills.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from chatfleet_platform.common import procs
from operator_it import Kube, chatbot, wait_until
from operator_process import OperatorProcess
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import MetricsHandler

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SERVING = "chatfleet.io/serving"
LOAD_DELAY = "3s"


class InflightExporter:
    """Serves chatfleet_inflight_requests per serving pod: the total load split evenly over them."""

    def __init__(self, namespace: str, model: str) -> None:
        self.namespace, self.model = namespace, model
        self.total = 0.0
        self.pods: list[str] = []
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.port = procs.free_port()
        handler = MetricsHandler.factory(self.registry)
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def collect(self):
        """One sample per serving pod (a placeholder pod while there is none)."""
        family = GaugeMetricFamily(
            "chatfleet_inflight_requests", "Requests being served", labels=["namespace", "model", "pod"]
        )
        pods = list(self.pods) or ["none"]
        for pod in pods:
            family.add_metric([self.namespace, self.model, pod], self.total / len(pods))
        yield family

    def stop(self) -> None:
        self.server.shutdown()


@pytest.fixture
def keda_kube(keda, chatfleet_crd, tmp_path):
    """A keda-* namespace with an operator process on auto-discovery (it finds KEDA)."""
    cluster = chatfleet_crd
    ns = f"keda-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    op = OperatorProcess(cluster, tmp_path / "operator", ("keda-*",))
    (tmp_path / "operator").mkdir()
    op.start()
    try:
        yield Kube(cluster, ns, op)
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def pods(kube: Kube) -> list[dict[str, Any]]:
    """The ChatbotService's stable pods that are not being deleted."""
    items = kube.get("pods", selector="chatfleet.io/service=bot,chatfleet.io/track=stable") or []
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def serving(kube: Kube) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods(kube) if p["metadata"]["labels"].get(SERVING) == "true")


def decision(kube: Kube) -> int:
    """The HPA's decision as written through the scale subresource."""
    return int(kube.get("chatbotservice", "bot")["spec"]["scaling"].get("replicas") or 0)


def test_keda_scales_a_chatbotservice_up_and_down_with_a_warm_pool(keda_kube, make_prometheus):
    kube = keda_kube
    exporter = InflightExporter(kube.ns, "bot")
    prom = make_prometheus(targets=[f"127.0.0.1:{exporter.port}"])
    try:
        kube.apply(
            chatbot(
                "bot",
                resources={"gpuProduct": "NVIDIA-H100-80GB-HBM3", "cpu": "1", "memory": "4Gi"},
                podMetadata={"annotations": {"sim.chatfleet.io/model-load-delay": LOAD_DELAY}},
                analysis={"prometheusAddress": prom.url},
                scaling={
                    "autoscale": {
                        "minReplicas": 1,
                        "maxReplicas": 4,
                        "targets": {"inFlightRequests": 4},
                        "scaleDownStabilizationSeconds": 0,
                        "warmPool": {"replicas": 1},
                    }
                },
            )
        )

        def feed() -> None:
            exporter.pods = serving(kube)

        # tick 1: the operator found KEDA: a ScaledObject, no HPA of its own; one serving pod, one warm.
        assert wait_until(lambda: kube.get("scaledobject", "bot") is not None, 60), kube.diagnose("bot")
        so = kube.get("scaledobject", "bot")
        assert so["spec"]["scaleTargetRef"]["kind"] == "ChatbotService"
        assert kube.get("horizontalpodautoscaler", "bot") is None

        def settled(n: int) -> bool:
            feed()
            st = kube.get("chatbotservice", "bot").get("status") or {}
            pool = (st.get("autoscaling") or {}).get("warmPool") or {}
            return len(serving(kube)) == n and pool.get("ready") == 1 and st.get("desiredReplicas") == n

        assert wait_until(lambda: settled(1), 120), kube.diagnose("bot")
        st = kube.get("chatbotservice", "bot")["status"]
        assert st["autoscaling"]["metricsSource"] == "KEDA"
        assert st["selector"].endswith(f"{SERVING}=true")
        svc = kube.get("service", "bot")
        assert svc["spec"]["selector"][SERVING] == "true"
        warm = [p["metadata"]["name"] for p in pods(kube) if p["metadata"]["labels"].get(SERVING) == "false"]

        # tick 2: 14 requests in flight over a target of 4 per replica: the real HPA decides 4.
        exporter.total = 14.0
        assert wait_until(lambda: (feed(), decision(kube) == 4)[1], 120), (
            kube.get("horizontalpodautoscaler", selector=None),
            kube.diagnose("bot"),
        )
        # the warm pod joins the Service at once (it was Ready with its model loaded)
        assert wait_until(lambda: warm[0] in serving(kube), 30), kube.diagnose("bot")
        assert wait_until(lambda: settled(4), 120), kube.diagnose("bot")
        st = kube.get("chatbotservice", "bot")["status"]
        active = next(c for c in st["conditions"] if c["type"] == "ScalingActive")
        assert active["status"] != "False", active
        load = st["autoscaling"]["modelLoadSeconds"]
        assert load["seconds"] >= 2.5 and load["samples"] >= 1, load

        # tick 3: the load goes away: the real HPA scales down to 1; the pool stays.
        exporter.total = 1.0
        assert wait_until(lambda: (feed(), decision(kube) == 1)[1], 120), kube.diagnose("bot")
        assert wait_until(lambda: settled(1), 120), kube.diagnose("bot")
    finally:
        exporter.stop()
        print(json.dumps((kube.get("chatbotservice", "bot") or {}).get("status"), indent=1)[:3000])
