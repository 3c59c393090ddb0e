"""The scrape contract, proven with a real Prometheus scraping a real chat API + Triton.

Test design: nothing about ports is written here. The pod's annotations and container ports come from the
operator's Deployment builder, the PodMonitor's endpoints and relabelling from the rendered chart. Each is
turned into a Prometheus scrape configuration the way Kubernetes service discovery would feed it (one
target per pod for annotation discovery, one per container port for the PodMonitor, with the
`__meta_kubernetes_*` labels the pod would carry). The only test-specific rule maps the pod's
`IP:port` onto the local process that plays that container (`127.0.0.1:<free port>`). Then the
operator's own analysis queries (`analysis/queries.py`) must return data from each Prometheus, and
Triton's series (re-exported by the chat API) must be there too.
"""

from __future__ import annotations

import re
import time

import pytest
from chatfleet_operator import api
from chatfleet_operator.analysis import queries
from chatfleet_operator.builders import build_deployment
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef
from chatfleet_platform.load.realpods import fleet_podmonitor
from chatfleet_platform.localruntime.testing import ChatApiProcess, post_json

pytestmark = [pytest.mark.triton, pytest.mark.prometheus, pytest.mark.slow]

NAMESPACE, SERVICE, TRACK = "shop", "tiny-chat", api.TRACK_CANARY
POD_IP = "10.1.2.3"


@pytest.fixture(scope="module")
def pod():
    """The pod template the operator builds for the canary track of `shop/tiny-chat`."""
    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}})
    dep = build_deployment(
        ObjectRef(NAMESPACE, SERVICE, "uid-1", 1),
        spec,
        PodSettings(),
        revision="rev1",
        track=TRACK,
    )
    return dep["spec"]["template"]


@pytest.fixture(scope="module")
def podmonitor():
    """The fleet PodMonitor rendered from the chart (helm must be built: `make platform-build`)."""
    return fleet_podmonitor()


@pytest.fixture(scope="module")
def chat_api(rt_workdir, triton, make_api_env, pod):
    """The chat API as the pod runs it: env from the builder's chat-api container (literal values)."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "chat-api")
    env = {
        e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"].startswith("CHATFLEET")
    }
    # In the pod Triton's metrics are at 127.0.0.1:8002; here the local Triton's port stands in for it.
    assert env["CHATFLEET_TRITON_METRICS_URL"] == "http://127.0.0.1:8002/metrics"
    env["CHATFLEET_TRITON_METRICS_URL"] = triton.metrics_url
    # CHATFLEET_TRACK / CHATFLEET_REVISION come from the pod labels (downward API) in a pod
    labels = pod["metadata"]["labels"]
    env.update(
        CHATFLEET_MODEL_NAME=SERVICE,
        CHATFLEET_TRACK=labels[api.LABEL_TRACK],
        CHATFLEET_REVISION=labels[api.LABEL_REVISION],
    )
    proc = ChatApiProcess(triton.grpc_url, make_api_env(None, **env), log_path=rt_workdir / "api-scrape.log")
    try:
        yield proc.start()
    finally:
        proc.stop()


def meta_labels(pod) -> dict[str, str]:
    """The __meta_kubernetes_* labels Kubernetes service discovery gives a target of this pod."""
    labels = {"__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_ip": POD_IP}
    for key, value in pod["metadata"]["labels"].items():
        labels["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    for key, value in pod["metadata"]["annotations"].items():
        labels["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    return labels


def pod_network(container_port: int, local: str) -> dict:
    """The one test-specific rule: the pod's IP:port is the local process playing that container."""
    return {
        "source_labels": ["__address__"],
        "regex": re.escape(f"{POD_IP}:{container_port}"),
        "target_label": "__address__",
        "replacement": local,
    }


@pytest.fixture(scope="module")
def pod_network_map(pod, chat_api, triton) -> dict[int, str]:
    """Each container port of the pod -> the local process playing that container (Triton declares none:
    it listens on the pod's loopback)."""
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    return {
        ports["chat"]: chat_api.url.removeprefix("http://"),
        ports["admin"]: chat_api.admin_url.removeprefix("http://"),
        ports["metrics"]: chat_api.metrics_url.removeprefix("http://").removesuffix("/metrics"),
    }


def annotation_job(pod, locals_by_port: dict[int, str]) -> dict:
    """Prometheus' usual annotation-based pod discovery (prometheus.io/scrape, /port, /path)."""
    return {
        "job_name": "kubernetes-pods",
        "static_configs": [{"targets": [POD_IP], "labels": meta_labels(pod)}],
        "relabel_configs": [
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                "action": "keep",
                "regex": "true",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                "target_label": "__metrics_path__",
                "regex": "(.+)",
            },
            {
                "source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                "regex": r"([^:]+)(?::\d+)?;(\d+)",
                "replacement": "$1:$2",
                "target_label": "__address__",
            },
            # the labels the analysis needs, as docs/releases.md shows them
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_label_chatfleet_io_track"], "target_label": "track"},
            *(pod_network(port, local) for port, local in locals_by_port.items()),
        ],
    }


def podmonitor_jobs(pod, monitor, locals_by_port: dict[int, str]) -> list[dict]:
    """What prometheus-operator generates from the PodMonitor: per endpoint, keep the targets whose
    container port has the endpoint's name, set the path, add namespace, apply its relabelings."""
    targets = []
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            labels = {
                **meta_labels(pod),
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": port["name"],
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
            }
            targets.append({"targets": [f"{POD_IP}:{port['containerPort']}"], "labels": labels})
    jobs = []
    for i, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        relabel = [
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "action": "keep",
                "regex": endpoint["port"],
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        ]
        relabel += [
            {"source_labels": r["sourceLabels"], "target_label": r["targetLabel"]}
            for r in endpoint.get("relabelings", [])
        ]
        relabel += [pod_network(port, local) for port, local in locals_by_port.items()]
        jobs.append(
            {
                "job_name": f"podmonitor-{i}",
                "metrics_path": endpoint.get("path", "/metrics"),
                "static_configs": targets,
                "relabel_configs": relabel,
            }
        )
    return jobs


def chat_once(api_url: str, i: int) -> None:
    status, body = post_json(
        f"{api_url}/v1/chat/completions",
        {"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 3},
        timeout=60,
    )
    assert status == 200, body


def analysis_queries_return_data(prom, api_url: str, timeout: float = 60.0) -> None:
    """The operator's analysis queries (and a Triton series) answer with data while traffic flows."""
    from prometheus_api_client import PrometheusConnect

    client = PrometheusConnect(prom.url, disable_ssl=True)
    target = queries.Target(NAMESPACE, SERVICE, TRACK)
    window = queries.window_seconds(5)
    wanted = {
        "request rate": queries.request_rate(target, window),
        "P99 latency": queries.latency_p99(target, window),
        "P99 TTFT": queries.ttft_p99(target, window),
        "Triton (re-exported)": f'sum(rate(nv_inference_count{{namespace="{NAMESPACE}",track="{TRACK}"}}[{window}s]))',
    }
    answers: dict[str, list] = {}
    deadline = time.monotonic() + timeout
    i = 0
    while time.monotonic() < deadline:
        chat_once(api_url, i)  # traffic keeps flowing so rate() sees an increase
        i += 1
        answers = {name: client.custom_query(q) for name, q in wanted.items()}
        if all(a and float(a[0]["value"][1]) > 0 for a in answers.values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"analysis queries without data after {timeout:.0f}s: {answers}")


def test_annotation_discovery_finds_what_the_analysis_queries(
    pod, chat_api, pod_network_map, make_prometheus
):
    annotations = pod["metadata"]["annotations"]
    chat = next(c for c in pod["spec"]["containers"] if c["name"] == "chat-api")
    assert int(annotations["prometheus.io/port"]) in {p["containerPort"] for p in chat["ports"]}
    prom = make_prometheus(scrape_configs=[annotation_job(pod, pod_network_map)])
    analysis_queries_return_data(prom, chat_api.url)


def test_chart_podmonitor_finds_what_the_analysis_queries(
    pod, podmonitor, chat_api, pod_network_map, make_prometheus
):
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    scraped = [e["port"] for e in podmonitor["spec"]["podMetricsEndpoints"]]
    assert all(name in ports for name in scraped), (scraped, ports)
    # the PodMonitor and the annotation name the same port: one scrape contract, no double counting
    assert [ports[name] for name in scraped] == [int(pod["metadata"]["annotations"]["prometheus.io/port"])]
    prom = make_prometheus(scrape_configs=podmonitor_jobs(pod, podmonitor, pod_network_map))
    analysis_queries_return_data(prom, chat_api.url)


def test_every_answer_names_the_pods_track(chat_api):
    """Track echo (docs/releases.md): JSON answers, streams and errors all carry the pod's track."""
    import httpx

    with httpx.Client(timeout=60) as client:
        url = f"{chat_api.url}/v1/chat/completions"
        ok = client.post(url, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        bad = client.post(url, json={"messages": []})
        with client.stream(
            "POST",
            url,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True},
        ) as streamed:
            streamed.read()
    for resp in (ok, bad, streamed):
        assert resp.headers["x-chatfleet-track"] == TRACK and resp.headers["x-chatfleet-revision"] == "rev1"
    assert (ok.status_code, bad.status_code, streamed.status_code) == (200, 400, 200)
