"""The operator's own metrics: every series exists with its help text, and each moves where it is counted.

Test design: the metrics live in prometheus_client's default registry (one per process, as the operator
serves them), so each test reads a series before and after what it drives and asserts the difference.
Releases run through `reconcile_pass` against a fake API client and a fake Prometheus, on a small
simulated cluster: after each pass every Deployment is fully rolled out and its pods Ready, the clock
moving on by the seconds each tick names. Passes, the queue and the API requests run through the
Controller and kube.request with fakes in place of the API server.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from chatfleet_operator import api, kube, metrics
from chatfleet_operator.analysis.assess import Sample
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.controller import Controller
from chatfleet_operator.converge.facts import NodeFacts, PodFacts
from chatfleet_operator.kinds import BY_NAME
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.settings import Settings
from chatfleet_operator.timefmt import rfc3339
from operator_helpers import as_observed, cbs_body, until
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
NODES = [NodeFacts(f"gpu-node-{i}", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, 8) for i in range(2)]


def value(name: str, **labels: str) -> float:
    """A sample of the default registry (0.0 when the label set has not been counted yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Series:
    """Reads of several samples, so that a test asserts what moved between two moments."""

    def __init__(self, *keys: tuple[str, dict[str, str]]) -> None:
        self.keys = keys
        self.before = self.read()

    def read(self) -> list[float]:
        """The samples now."""
        return [value(name, **labels) for name, labels in self.keys]

    def moved(self) -> list[float]:
        """Each sample's change since the Series was made."""
        return [now - then for now, then in zip(self.read(), self.before, strict=True)]


class FakeClient:
    """The API server for one ChatbotService: applies echo back with a growing resourceVersion."""

    def __init__(self) -> None:
        self.rv = 100
        self.events: list[str] = []

    def apply(self, manifest):
        self.rv += 1
        return as_observed(manifest, self.rv)

    def delete(self, kind, namespace, name):
        pass

    def patch_status(self, namespace, name, patch):
        return {}

    def seed_replicas(self, namespace, name, replicas):
        pass

    def label_pod(self, namespace, name, labels, annotations):
        pass

    def post_event(self, involved, type_, reason, message, now=None):
        self.events.append(reason)


class FakePrometheus:
    """The analysis provider: the canary's error rate is `error_rate` percent, stable's 0.1 %."""

    def __init__(self, error_rate: float) -> None:
        self.error_rate = error_rate

    def measure(self, plan, now):
        return Sample(now, 5.0, {"error rate": self.error_rate}, {"error rate": 0.1}, window_seconds=20)


class Cluster:
    """One ChatbotService and its Deployments: every pass's Deployments roll out at once, pods Ready."""

    def __init__(self, spec: dict[str, Any], prometheus: FakePrometheus) -> None:
        self.body = cbs_body(spec)
        self.snap = Snapshot(nodes=NODES)
        self.client, self.world = FakeClient(), World()
        self.releases = Releases(provider=prometheus)
        self.now = T0

    def tick(self, seconds: float = 1.0) -> dict[str, Any]:
        """Move the clock, run one pass, then let the cluster catch up with what it applied."""
        self.now += timedelta(seconds=seconds)
        outcome = reconcile_pass(
            self.client, self.body, self.snap, self.world, Settings(), self.now, self.releases
        )
        self.body["status"] = outcome.status
        self.snap.pods = []
        for (kind, name), dep in self.snap.children.items():
            if kind != "Deployment":
                continue
            replicas = dep["spec"].get("replicas", 1)
            dep["status"] = {
                "observedGeneration": 1,
                **dict.fromkeys(
                    ("replicas", "readyReplicas", "availableReplicas", "updatedReplicas"), replicas
                ),
            }
            labels = dep["spec"]["template"]["metadata"]["labels"]
            self.snap.pods += [
                PodFacts(
                    f"{name}-{i}",
                    labels[api.LABEL_REVISION],
                    labels[api.LABEL_TRACK],
                    "Running",
                    True,
                    node_name=NODES[i % 2].name,
                    ready_since=rfc3339(self.now),
                    ip=f"10.0.0.{i}",
                )
                for i in range(replicas)
            ]
        return outcome.status

    def release(self, revision: str) -> None:
        """Change the model revision: the next pass starts a release."""
        self.body["spec"]["model"]["revision"] = revision
        self.body["metadata"]["generation"] += 1

    def run_until(self, done, seconds: float = 1.0, ticks: int = 200) -> None:
        """Tick until done(status) holds."""
        for _ in range(ticks):
            if done(self.tick(seconds)):
                return
        raise AssertionError(f"not done after {ticks} ticks: {self.body['status'].get('release')}")


def spec(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Two replicas, a canary through `steps`, analysis every 10 s with failureLimit 2."""
    return {
        "model": {"uri": "hf://org/model", "revision": "v1"},
        "scaling": {"replicas": 2},
        "rollout": {"strategy": "canary", "canary": {"steps": steps}},
        "analysis": {"intervalSeconds": 10, "failureLimit": 2},
    }


def stable(status: dict[str, Any]) -> bool:
    """No release: the stable revision serves."""
    return bool(status.get("stableRevision")) and status.get("release") is None


def rolled_back(status: dict[str, Any]) -> bool:
    """The release was rolled back."""
    return (status.get("release") or {}).get("phase") == "RolledBack"


def test_every_series_has_the_prefix_help_and_unit_in_its_name():
    families = {
        f.name: f for f in text_string_to_metric_families(exposition()) if f.name.startswith("chatfleet")
    }
    assert set(families) == {
        "chatfleet_operator_reconcile_passes",
        "chatfleet_operator_reconcile_duration_seconds",
        "chatfleet_operator_queue_depth",
        "chatfleet_operator_reconcile_running",
        "chatfleet_operator_oldest_pass_seconds",
        "chatfleet_operator_handlers_held_seconds",
        "chatfleet_operator_api_requests",
        "chatfleet_operator_api_request_duration_seconds",
        "chatfleet_operator_releases_started",
        "chatfleet_operator_releases_promoted",
        "chatfleet_operator_releases_rolled_back",
        "chatfleet_operator_release_failure_to_rollback_seconds",
        "chatfleet_operator_analysis_measurements",
        "chatfleet_operator_analysis_figures",
    }
    for family in families.values():
        assert len(family.documentation) > 20, family.name
        if family.type == "counter":  # the parser drops _total from a counter family's name
            assert not family.name.endswith("_total")
        if family.type == "histogram":
            assert family.name.endswith("_seconds")


def exposition() -> str:
    """The /metrics text of the default registry, as the operator serves it."""
    return generate_latest(REGISTRY).decode()


def test_a_bad_canary_moves_the_release_and_analysis_series_and_the_rollback_delay():
    cluster = Cluster(spec([{"weight": 50, "pauseSeconds": 60}]), FakePrometheus(error_rate=9.0))
    cluster.run_until(stable)
    series = Series(
        ("chatfleet_operator_releases_started_total", {"strategy": "canary"}),
        ("chatfleet_operator_releases_rolled_back_total", {"strategy": "canary"}),
        ("chatfleet_operator_releases_promoted_total", {"strategy": "canary"}),
        ("chatfleet_operator_analysis_measurements_total", {"verdict": "Failed"}),
        ("chatfleet_operator_analysis_figures_total", {"metric": "error rate", "result": "failed"}),
        ("chatfleet_operator_release_failure_to_rollback_seconds_count", {"strategy": "canary"}),
        ("chatfleet_operator_release_failure_to_rollback_seconds_sum", {"strategy": "canary"}),
        (
            "chatfleet_operator_release_failure_to_rollback_seconds_bucket",
            {"strategy": "canary", "le": "10.0"},
        ),
        (
            "chatfleet_operator_release_failure_to_rollback_seconds_bucket",
            {"strategy": "canary", "le": "5.0"},
        ),
    )
    cluster.release("v2")
    cluster.run_until(rolled_back)
    analysis = cluster.body["status"]["release"]["analysis"]
    first, last = analysis["firstFailedAt"], cluster.body["status"]["release"]["rolledBackAt"]
    assert (analysis["failed"], first, last) == (2, "2026-11-21T10:00:24Z", "2026-11-21T10:00:34Z")
    # one release started and rolled back, after two failed measurements 10 s apart: 10 s observed
    assert series.moved() == [1, 1, 0, 2, 2, 1, 10, 1, 0]
    for _ in range(20):  # the rolled-back release stays in status, Stalled, until the spec changes
        cluster.tick()
    assert series.moved() == [1, 1, 0, 2, 2, 1, 10, 1, 0], "a rolled-back release is counted once"
    assert cluster.client.events.count("RolledBack") == 1


def test_a_good_canary_moves_started_promoted_and_the_successful_figures():
    cluster = Cluster(
        spec([{"weight": 50, "pauseSeconds": 15}, {"weight": 100, "pauseSeconds": 0, "analysis": False}]),
        FakePrometheus(error_rate=0.2),
    )
    cluster.run_until(stable)
    series = Series(
        ("chatfleet_operator_releases_started_total", {"strategy": "canary"}),
        ("chatfleet_operator_releases_promoted_total", {"strategy": "canary"}),
        ("chatfleet_operator_releases_rolled_back_total", {"strategy": "canary"}),
        ("chatfleet_operator_analysis_figures_total", {"metric": "error rate", "result": "failed"}),
        ("chatfleet_operator_release_failure_to_rollback_seconds_count", {"strategy": "canary"}),
    )
    measured = value("chatfleet_operator_analysis_measurements_total", verdict="Successful")
    ok = value("chatfleet_operator_analysis_figures_total", metric="error rate", result="ok")
    cluster.release("v2")
    cluster.run_until(
        lambda status: stable(status) and (status.get("releaseHistory") or [{}])[0].get("result")
    )
    assert cluster.body["status"]["releaseHistory"][0]["result"] == "Promoted"
    assert series.moved() == [1, 1, 0, 0, 0]
    assert value("chatfleet_operator_analysis_measurements_total", verdict="Successful") > measured
    assert value("chatfleet_operator_analysis_figures_total", metric="error rate", result="ok") > ok


class ControllerClient(FakeClient):
    """A fake API client whose apply can block (a hung pass) or raise (a failing pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.release_pass = threading.Event()
        self.blocking = False
        self.failing = False

    def apply(self, manifest):
        if self.failing:
            raise RuntimeError("injected failure")
        if self.blocking:
            assert self.release_pass.wait(10), "the test never let the pass go"
        return super().apply(manifest)


SPEC = {"model": {"uri": "hf://org/model"}, "runtime": {"sessions": {"redis": {"secretName": "r"}}}}


def controller_with_nodes(client: ControllerClient) -> Controller:
    """A Controller whose node index holds two H100 nodes (kopf's indexes are plain mappings here)."""
    controller = Controller(Settings(), client)
    controller.world.indexes = {BY_NAME["Node"].index: {"nodes": NODES}}
    return controller


def test_passes_are_counted_by_trigger_and_result_and_timed():
    client = ControllerClient()
    controller = controller_with_nodes(client)
    series = Series(
        ("chatfleet_operator_reconcile_passes_total", {"trigger": "handler", "result": "success"}),
        ("chatfleet_operator_reconcile_passes_total", {"trigger": "handler", "result": "problem"}),
        ("chatfleet_operator_reconcile_passes_total", {"trigger": "handler", "result": "error"}),
        ("chatfleet_operator_reconcile_duration_seconds_count", {}),
    )
    assert asyncio.run(controller.attempt(("ns", "bot"), cbs_body(SPEC))) is None
    no_such_gpu = {"model": {"uri": "hf://org/model"}, "resources": {"gpuProduct": "NVIDIA-B200"}}
    retry = asyncio.run(controller.attempt(("ns", "b200"), cbs_body(no_such_gpu, name="b200")))
    assert retry is not None and "NoMatchingGPUNodes" in retry.why
    client.failing = True
    retry = asyncio.run(controller.attempt(("ns", "failing"), cbs_body(SPEC, name="failing")))
    assert retry is not None and "injected failure" in retry.why
    assert series.moved() == [1, 1, 1, 3]
    assert value("chatfleet_operator_queue_depth") == 0 and value("chatfleet_operator_reconcile_running") == 0


def test_a_pass_that_does_not_end_shows_in_the_queue_and_the_oldest_pass():
    """Test design: one pass blocks in its worker thread; a second pass of the same object waits for the
    first one's lock; both are unfinished, one running, one queued, and the oldest one's age grows."""
    client = ControllerClient()
    client.blocking = True
    controller = controller_with_nodes(client)

    async def scenario() -> tuple[float, float, float, float, float]:
        first = asyncio.create_task(controller.run_pass(("ns", "bot"), cbs_body(SPEC)))
        second = asyncio.create_task(controller.run_pass(("ns", "bot"), cbs_body(SPEC)))
        await until(
            lambda: (
                (value("chatfleet_operator_reconcile_running"), value("chatfleet_operator_queue_depth"))
                == (1, 1)
            )
        )
        seen = (
            value("chatfleet_operator_reconcile_running"),
            value("chatfleet_operator_queue_depth"),
            value("chatfleet_operator_oldest_pass_seconds"),
        )
        await asyncio.sleep(0.3)
        older = value("chatfleet_operator_oldest_pass_seconds")
        client.release_pass.set()
        await asyncio.gather(first, second)
        return (*seen, older, value("chatfleet_operator_oldest_pass_seconds"))

    running, queued, oldest, later, after = asyncio.run(scenario())
    assert (running, queued) == (1, 1)
    assert oldest > 0 and later - oldest >= 0.25
    assert after == 0.0
    assert value("chatfleet_operator_queue_depth") == 0 and value("chatfleet_operator_reconcile_running") == 0


def test_debounced_triggers_count_in_the_queue_once_per_object():
    controller = Controller(Settings(), ControllerClient())

    async def scenario() -> tuple[float, float]:
        controller.trigger(("ns", "a"))
        controller.trigger(("ns", "a"))  # merged into the first
        controller.trigger(("ns", "b"))
        waiting = value("chatfleet_operator_queue_depth")
        await asyncio.sleep(controller.settings.retry.trigger_debounce + 0.3)
        return waiting, value("chatfleet_operator_queue_depth")

    waiting, after = asyncio.run(scenario())
    assert (waiting, after) == (2, 0)  # neither object is in the world: nothing to run, nothing left


class FakeResponse:
    """What the kubernetes client's call_api returns."""

    def __init__(self, status: int, data: bytes = b"{}") -> None:
        self.status, self.reason, self.data = status, "reason", data

    def read(self) -> bytes:
        return self.data


class FakeApiClient:
    """kube.py's ApiClient: serialises nothing, answers each request with the next response (or error)."""

    def __init__(self, *answers: FakeResponse | Exception) -> None:
        self.answers = list(answers)

    def param_serialize(self, method, path, **_: Any):
        return method, path, {}, None, None

    def call_api(self, method, url, **_: Any):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_api_requests_are_counted_by_verb_kind_and_code(monkeypatch):
    manifest = {"kind": "Deployment", "metadata": {"namespace": "ns", "name": "bot"}}
    fake = FakeApiClient(
        FakeResponse(200),
        FakeResponse(404, b'{"message": "not found"}'),
        FakeResponse(201),
        ConnectionRefusedError("refused"),
    )
    monkeypatch.setattr(kube, "_client", fake)
    series = Series(
        ("chatfleet_operator_api_requests_total", {"verb": "APPLY", "kind": "Deployment", "code": "200"}),
        ("chatfleet_operator_api_requests_total", {"verb": "GET", "kind": "ConfigMap", "code": "404"}),
        ("chatfleet_operator_api_requests_total", {"verb": "POST", "kind": "Event", "code": "201"}),
        (
            "chatfleet_operator_api_requests_total",
            {"verb": "PATCH", "kind": "ChatbotService/status", "code": "error"},
        ),
        ("chatfleet_operator_api_request_duration_seconds_count", {"verb": "APPLY"}),
    )
    kube.apply(manifest)
    assert kube.config_map_data("ns", "prompts") is None
    kube.post_event({"metadata": {"namespace": "ns", "name": "bot"}}, "Normal", "Test", "message")
    with pytest.raises(ConnectionRefusedError):
        kube.patch_status("ns", "bot", {"phase": "Ready"})
    assert series.moved() == [1, 1, 1, 1, 1]


def test_the_benchmark_figures_count_the_same_requests_writes_and_passes(monkeypatch):
    """--stats-file's raw figures (metrics.raw_figures) come from the edges that move the series: kube.py's
    requests and writes, the controller's passes (a failed pass included: it ran and took its time)."""
    before = metrics.raw_figures()
    fake = FakeApiClient(FakeResponse(200), FakeResponse(200), FakeResponse(201))
    monkeypatch.setattr(kube, "_client", fake)
    kube.apply({"kind": "Deployment", "metadata": {"namespace": "ns", "name": "bot"}})
    kube.apply({"kind": "Deployment", "metadata": {"namespace": "ns", "name": "bot2"}})
    kube.post_event({"metadata": {"namespace": "ns", "name": "bot"}}, "Normal", "Test", "message")
    client = ControllerClient()
    controller = controller_with_nodes(client)
    asyncio.run(controller.attempt(("ns", "bot"), cbs_body(SPEC)))
    client.failing = True
    asyncio.run(controller.attempt(("ns", "failing"), cbs_body(SPEC, name="failing")))
    after = metrics.raw_figures()
    writes = {
        k: after["writes"].get(k, 0) - before["writes"].get(k, 0) for k in ("APPLY Deployment", "POST Event")
    }
    assert writes == {"APPLY Deployment": 2, "POST Event": 1}
    assert len(after["request_seconds"]) == len(before["request_seconds"]) + 3
    assert after["passes"] == before["passes"] + 2
    assert len(after["latencies_s"]) == after["passes"] and all(s >= 0 for s in after["latencies_s"])


def test_the_benchmark_figures_stay_bounded(monkeypatch):
    monkeypatch.setattr(metrics, "_RAW_LIMIT", 10)
    monkeypatch.setattr(metrics, "_request_seconds", [])
    for i in range(25):
        metrics.api_request("GET", "Pod", "200", float(i))
    kept = metrics.raw_figures()["request_seconds"]
    assert len(kept) <= 10 and kept[-1] == 24.0  # the oldest went, the newest stayed


def test_serve_answers_metrics_over_http():
    port = metrics.serve(0, "127.0.0.1")
    metrics.release_started("blueGreen")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'chatfleet_operator_releases_started_total{strategy="blueGreen"}' in text
    assert "process_cpu_seconds_total" in text  # prometheus_client's process collector rides along


@pytest.mark.parametrize(
    ("first_failed", "rolled_back", "observed"),
    [
        pytest.param(T0, T0 + timedelta(seconds=20), 20.0, id="analysis-rollback-20s"),
        pytest.param(None, T0, None, id="health-or-abort-not-observed"),
        pytest.param(T0 + timedelta(seconds=3), T0, 0.0, id="clock-skew-never-negative"),
    ],
)
def test_rollback_delay_from_the_first_failed_measurement(first_failed, rolled_back, observed):
    labels = {"strategy": "test-delay"}
    before = value("chatfleet_operator_release_failure_to_rollback_seconds_sum", **labels)
    count = value("chatfleet_operator_release_failure_to_rollback_seconds_count", **labels)
    metrics.release_rolled_back("test-delay", first_failed, rolled_back)
    moved = value("chatfleet_operator_release_failure_to_rollback_seconds_count", **labels) - count
    assert moved == (0 if observed is None else 1)
    if observed is not None:
        assert (
            value("chatfleet_operator_release_failure_to_rollback_seconds_sum", **labels) - before == observed
        )


def test_an_apply_is_sent_as_the_bytes_orjson_made_through_the_clients_rest_layer(monkeypatch):
    """kube.apply hands the client its body already encoded (orjson), and the kubernetes client's REST layer
    sends those bytes as they are for apply's content type: a client that re-encoded them (or refused
    them) fails here. The real ApiClient and RESTClientObject, only urllib3's pool replaced."""
    import kubernetes
    import orjson
    import urllib3

    manifest = {"kind": "Deployment", "metadata": {"namespace": "ns", "name": "bot"}, "spec": {"replicas": 2}}
    sent: list[tuple[str, str, Any, dict[str, str]]] = []

    class Pool:
        def request(self, method, url, body=None, headers=None, **_: Any):
            sent.append((method, url, body, dict(headers or {})))
            return urllib3.HTTPResponse(body=b'{"kind": "Deployment"}', status=200, preload_content=False)

    configuration = kubernetes.client.Configuration()
    configuration.host = "https://127.0.0.1:6443"
    client = kubernetes.client.ApiClient(configuration)
    client.rest_client.pool_manager = Pool()
    monkeypatch.setattr(kube, "_client", client)
    assert kube.apply(manifest) == {"kind": "Deployment"}
    ((method, url, body, headers),) = sent
    assert (method, headers["Content-Type"]) == ("PATCH", kube.APPLY_PATCH)
    assert url.startswith("https://127.0.0.1:6443/apis/apps/v1/namespaces/ns/deployments/bot?")
    assert isinstance(body, bytes) and orjson.loads(body) == manifest
