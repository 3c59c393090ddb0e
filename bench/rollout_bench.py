"""`make bench-rollout`: Chatfleet against the real Argo Rollouts controller, on the same platform, measured alike.

Both operators run against one local Kubernetes (kwok GPU nodes,
`chatfleet_platform.cluster.cluster.Cluster`): the Chatfleet operator as a subprocess, and the Argo
Rollouts controller v1.10.2 built from the Go module proxy (`bash hack/build-platform.sh argo-rollouts`,
cached by version) run out of cluster. Each scenario gives each tool its own namespace, its own
simulated traffic (`chatfleet_platform.load.trafficsim.TrafficSim`: the runtime's metric names, per-track
error rate and latency) and one real Prometheus scraping both.
Both use the replica-ratio canary (no traffic router): users call one Service whose selector takes stable
and canary pods, so "no request reaches the canary" means no Ready canary pod among that Service's
EndpointSlice endpoints. Both are judged by the same PromQL (`chatfleet_operator.analysis.queries`: error
rate, P99 latency and P99 time to first token of the canary track, window 2 intervals), the same
thresholds, interval and failureLimit:

- Chatfleet: `spec.analysis` (intervalSeconds, failureLimit, thresholds); rolls back at the
  failureLimit-th failed measurement (failed >= failureLimit), with a noise rule on the error rate
  (too few failed requests to be significant at the limit's rate do not fail a measurement).
- Argo Rollouts: an AnalysisTemplate with three `provider.prometheus` metrics (the same queries,
  `successCondition: result[0] <= limit`, `interval`, `failureLimit`, `consecutiveErrorLimit`) run as the
  canary's background analysis; a metric fails when failed > failureLimit, the AnalysisRun fails, and the
  Rollout aborts (canary ReplicaSet scaled to zero).

Both clocks are read from outside, by the same watcher (pods and EndpointSlices of the tool's namespace):

1. canary bad on errors (20% errors, limit 1%): from the moment this script turns the canary's traffic bad
   to the moment no Ready canary pod is behind the Service;
2. the same, canary bad on latency (P99 ~3 s, limit 1 s);
3. canary pods never Ready (the kwok label `sim.chatfleet.io/health: unready`), progress deadline
   PROGRESS_DEADLINE (30 s) for both (Chatfleet `spec.analysis.progressDeadlineSeconds`; Argo
   `progressDeadlineSeconds` with `progressDeadlineAbort: true`): from the spec change to the canary pods
   deleted;
4. a healthy 5-step canary (10/20/40/60/100 %, 10 s pause after each), total promotion time: from the
   spec change to the tool reporting the new revision stable with only its pods Ready behind the Service.

Plus false rollbacks over HEALTHY_RELEASES healthy releases per tool (50 % for 2 s, then 100 %; analysis
every 2 s). Each scenario runs the tools side by side at the same moment, each in fresh namespaces; rows
1-4 are repeated ROLLBACK_RUNS times and averaged. Rows 1-2 also run Argo with failureLimit one lower
(it then aborts at Chatfleet's count of failed measurements), to show what the counting rule accounts for.

Writes bench-results/rollout.json and prints a table (Chatfleet / Argo ratios). Environment:
ROLLBACK_RUNS (3), HEALTHY_RELEASES (20), PROGRESS_DEADLINE (30).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

from chatfleet_operator.analysis import queries  # noqa: E402
from chatfleet_platform.cluster.cluster import Cluster  # noqa: E402
from chatfleet_platform.common import procs  # noqa: E402
from chatfleet_platform.common.config import (  # noqa: E402
    CHATBOT_CRD_NAME,
    LOCAL_ANALYSIS_ARGS,
    PlatformError,
    cache_dir,
    read_versions,
)
from chatfleet_platform.load.trafficsim import TrafficSim  # noqa: E402
from chatfleet_platform.servers import services  # noqa: E402

INTERVAL, FAILURE_LIMIT, CONSECUTIVE_ERROR_LIMIT = 10, 2, 4
ROLLBACK_RUNS = int(os.environ.get("ROLLBACK_RUNS", "3"))
HEALTHY_RELEASES = int(os.environ.get("HEALTHY_RELEASES", "20"))
PROGRESS_DEADLINE = int(os.environ.get("PROGRESS_DEADLINE", "30"))
REPLICAS = 5
#: Thresholds of both tools (percent, milliseconds).
ERROR_RATE_PERCENT, LATENCY_P99_MS, TTFT_P99_MS = 1.0, 1000, 1000
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
#: The label the bench puts on every pod template: which revision a pod (and so an endpoint) runs.
REV_LABEL = "bench.chatfleet.io/rev"
SERVICE = "bot"
HOLD = [(20, 3600)]  # a canary holding at 20 % (rows 1-3)
FIVE = [(w, 10) for w in (10, 20, 40, 60, 100)]  # row 4
SHORT = [(50, 2), (100, 0)]  # false-rollback releases
TOOLS = ("chatfleet", "argo")
#: Rows 1-2 also run Argo with failureLimit one lower: it then aborts at the same count of failed
#: measurements as Chatfleet (failed > 1 is failed >= 2), which isolates the counting rule.
SAME_COUNT = "argo-same-count"
LABELS = {
    "chatfleet": "Chatfleet",
    "argo": "Argo Rollouts v1.10.2",
    SAME_COUNT: f"Argo Rollouts, failureLimit {FAILURE_LIMIT - 1}",
}


def say(msg: str) -> None:
    """Progress line."""
    print(f"[bench-rollout] {msg}", flush=True)


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Wait for pred() to return something true; return it (RuntimeError naming `what` on time-out)."""
    got = services.wait_until(pred, timeout, interval)
    if not got:
        raise RuntimeError(f"{what} did not happen within {timeout:.0f}s")
    return got


def argo_binaries() -> Path:
    """The Argo Rollouts build of the pinned version; built here (cached by version) when missing."""
    version = read_versions()["ARGO_ROLLOUTS_VERSION"]
    folder = cache_dir() / "bin" / f"argo-rollouts-{version}"
    if not (folder / "rollouts-controller").exists() or not (folder / "crds" / "rollout-crd.yaml").exists():
        say(f"building the Argo Rollouts controller v{version} (cached afterwards; ~4 min on 2 cores)")
        subprocess.run(["bash", str(REPO / "hack" / "build-platform.sh"), "argo-rollouts"], check=True)
    return folder


# ---- the outside clock: pods and EndpointSlices of one namespace -------------------------------------
class Watcher:
    """Watches the pods and the Service's EndpointSlices of one namespace; keeps a timed history.

    Every event appends a snapshot (monotonic time, Ready endpoints as (pod, revision), all endpoints,
    live pods as (pod, revision)); the measurements read the first snapshot after a moment that meets a
    predicate, so they are timed by the watch events, not by a polling loop.
    """

    def __init__(self, api: client.ApiClient, namespace: str, service: str) -> None:
        self.core, self.disc = client.CoreV1Api(api), client.DiscoveryV1Api(api)
        self.namespace, self.service = namespace, service
        self.rev: dict[str, str] = {}  # pod name -> revision label (kept after the pod is gone)
        self.pods: dict[str, str] = {}  # live, not deleting: pod name -> revision
        self.slices: dict[str, list[tuple[str, bool]]] = {}  # slice -> [(pod, ready)]
        self.history: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(kind,), daemon=True) for kind in ("pods", "slices")
        ]

    def start(self) -> Watcher:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self, kind: str) -> None:
        """List, then watch from that resourceVersion; relist on any failure."""
        if kind == "pods":
            lister, kw = self.core.list_namespaced_pod, {}
        else:
            lister = self.disc.list_namespaced_endpoint_slice
            kw = {"label_selector": f"kubernetes.io/service-name={self.service}"}
        while not self._stop.is_set():
            try:
                listing = lister(self.namespace, **kw)
                for item in listing.items:
                    self._apply(kind, "ADDED", item)
                rv = listing.metadata.resource_version
                for ev in watch.Watch().stream(
                    lister, self.namespace, resource_version=rv, timeout_seconds=5, **kw
                ):
                    self._apply(kind, ev["type"], ev["object"])
                    if self._stop.is_set():
                        return
            except Exception:  # a dropped or expired watch: list again
                time.sleep(0.2)

    def _apply(self, kind: str, event: str, obj: Any) -> None:
        """Fold one event into the state and record a snapshot."""
        now = time.monotonic()
        name = obj.metadata.name
        with self._lock:
            if kind == "pods":
                rev = (obj.metadata.labels or {}).get(REV_LABEL, "")
                self.rev[name] = rev
                if event == "DELETED" or obj.metadata.deletion_timestamp:
                    self.pods.pop(name, None)
                else:
                    self.pods[name] = rev
            elif event == "DELETED":
                self.slices.pop(name, None)
            else:
                self.slices[name] = [
                    (e.target_ref.name, e.conditions is None or e.conditions.ready is not False)
                    for e in obj.endpoints or []
                    if e.target_ref is not None
                ]
            self.history.append((now, self._snapshot()))

    def _snapshot(self) -> dict[str, Any]:
        endpoints = [(p, self.rev.get(p, "?"), ready) for eps in self.slices.values() for p, ready in eps]
        return {
            "ready": {(p, r) for p, r, ready in endpoints if ready},
            "endpoints": {(p, r) for p, r, _ in endpoints},
            "pods": set(self.pods.items()),
        }

    def now(self) -> dict[str, Any]:
        """The current snapshot."""
        with self._lock:
            return self._snapshot()

    def first_after(self, t0: float, pred: Callable[[dict[str, Any]], bool]) -> float | None:
        """The first moment at or after t0 whose state meets pred: t0 itself when the state in force at
        t0 (the last snapshot up to t0) does, else the time of the first later snapshot that does."""
        with self._lock:
            history = list(self.history)
        at_t0 = [s for t, s in history if t <= t0]
        if at_t0 and pred(at_t0[-1]):
            return t0
        return next((t for t, s in history if t > t0 and pred(s)), None)


def ready_revs(snap: dict[str, Any]) -> set[str]:
    """Revisions with a Ready pod behind the Service."""
    return {r for _, r in snap["ready"]}


def no_ready_pod_of(rev: str) -> Callable[[dict[str, Any]], bool]:
    """Predicate: no Ready endpoint of revision `rev` (no request can reach it)."""
    return lambda s: rev not in ready_revs(s)


def no_pod_of(rev: str) -> Callable[[dict[str, Any]], bool]:
    """Predicate: no live pod of revision `rev` (all deleted or being deleted)."""
    return lambda s: rev not in {r for _, r in s["pods"]}


def has_pod_of(rev: str) -> Callable[[dict[str, Any]], bool]:
    """Predicate: a live pod of revision `rev` exists."""
    return lambda s: rev in {r for _, r in s["pods"]}


def only_ready(rev: str, count: int) -> Callable[[dict[str, Any]], bool]:
    """Predicate: `count` Ready endpoints, all of revision `rev`."""
    return lambda s: ready_revs(s) == {rev} and len(s["ready"]) == count


# ---- the two tools ------------------------------------------------------------------------------------
def chatfleet_spec(
    prom: str, rev: str, steps: list[tuple[int, int]], interval: int, unready: bool = False
) -> dict[str, Any]:
    """A ChatbotService spec: the revision is the model revision, labelled on the pods."""
    labels = {REV_LABEL: rev, **({"sim.chatfleet.io/health": "unready"} if unready else {})}
    return {
        "model": {"uri": "hf://org/tiny", "revision": rev},
        "resources": {"gpuProduct": GPU_PRODUCT, "gpusPerReplica": 1, "cpu": "1", "memory": "4Gi"},
        "scaling": {"replicas": REPLICAS},
        "podMetadata": {"labels": labels},
        "rollout": {
            "strategy": "canary",
            "canary": {"steps": [{"weight": w, "pauseSeconds": p} for w, p in steps]},
        },
        "analysis": {
            "prometheusAddress": prom,
            "intervalSeconds": interval,
            "failureLimit": FAILURE_LIMIT,
            "consecutiveErrorLimit": CONSECUTIVE_ERROR_LIMIT,
            "progressDeadlineSeconds": PROGRESS_DEADLINE,
            "thresholds": {
                "errorRatePercent": ERROR_RATE_PERCENT,
                "latencyP99Milliseconds": LATENCY_P99_MS,
                "timeToFirstTokenP99Milliseconds": TTFT_P99_MS,
            },
        },
    }


def argo_steps(steps: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Chatfleet's (weight, pause seconds) steps as Argo canary steps, e.g. [(20, 10)] ->
    [{'setWeight': 20}, {'pause': {'duration': '10s'}}]; a pause of 0 is left out."""
    out: list[dict[str, Any]] = []
    for weight, pause in steps:
        out.append({"setWeight": weight})
        if pause:
            out.append({"pause": {"duration": f"{pause}s"}})
    return out


def argo_analysis_template(namespace: str, prom: str, interval: int, failure_limit: int) -> dict[str, Any]:
    """The AnalysisTemplate: Chatfleet's three checks as Prometheus metrics, on the same series."""
    target = queries.Target(namespace, SERVICE, "canary")
    window = queries.window_seconds(interval)
    checks = (
        ("error-rate", queries.error_rate_percent(target, window), ERROR_RATE_PERCENT),
        ("p99-latency", queries.latency_p99(target, window), LATENCY_P99_MS),
        ("p99-ttft", queries.ttft_p99(target, window), TTFT_P99_MS),
    )
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": "chat-metrics"},
        "spec": {
            "metrics": [
                {
                    "name": name,
                    "interval": f"{interval}s",
                    "failureLimit": failure_limit,
                    "consecutiveErrorLimit": CONSECUTIVE_ERROR_LIMIT,
                    "successCondition": f"result[0] <= {limit:g}",
                    "provider": {"prometheus": {"address": prom, "query": promql}},
                }
                for name, promql, limit in checks
            ]
        },
    }


def argo_rollout(rev: str, steps: list[tuple[int, int]], unready: bool = False) -> dict[str, Any]:
    """The Rollout: replica-ratio canary, background analysis, kwok GPU pods like Chatfleet's."""
    labels = {"app": SERVICE, REV_LABEL: rev, **({"sim.chatfleet.io/health": "unready"} if unready else {})}
    resources = {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": SERVICE},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": SERVICE}},
            "progressDeadlineSeconds": PROGRESS_DEADLINE,
            "progressDeadlineAbort": True,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "triton",
                            "image": "chatfleet-runtime:bench",
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "resources": {"requests": resources, "limits": resources},
                        }
                    ],
                },
            },
            "strategy": {
                "canary": {
                    "analysis": {"templates": [{"templateName": "chat-metrics"}]},
                    "steps": argo_steps(steps),
                }
            },
        },
    }


class Tool:
    """One tool's bot in its own namespace: deploy, release, read its own verdict."""

    def __init__(self, bench: Bench, kind: str, namespace: str, prom: str, sim: TrafficSim) -> None:
        self.b, self.kind, self.ns, self.prom, self.sim = bench, kind, namespace, prom, sim
        self.rev = ""
        self.before = ""  # Argo: stableRS before the release; Chatfleet: stableRevision
        self.watcher = Watcher(bench.api, namespace, SERVICE).start()

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    def deploy(self, rev: str, steps: list[tuple[int, int]], interval: int, unready: bool = False) -> None:
        """Create or update the bot at revision `rev` (an update starts a release)."""
        self.before = self._stable()
        self.rev = rev
        if self.kind == "chatfleet":
            doc = {
                "apiVersion": "chatfleet.io/v1alpha1",
                "kind": "ChatbotService",
                "metadata": {"name": SERVICE},
                "spec": chatfleet_spec(self.prom, rev, steps, interval, unready),
            }
            docs = [doc]
        else:
            limit = FAILURE_LIMIT - 1 if self.kind == SAME_COUNT else FAILURE_LIMIT
            template = argo_analysis_template(self.ns, self.prom, interval, limit)
            docs = [template, argo_rollout(rev, steps, unready)]
            if not self.before:
                svc = {
                    "selector": {"app": SERVICE},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                }
                docs.insert(
                    0, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE}, "spec": svc}
                )
        self.b.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), namespace=self.ns)

    def _obj(self) -> dict[str, Any]:
        """The bot's object ({} when absent)."""
        group, plural = (
            ("chatfleet.io", "chatbotservices") if self.kind == "chatfleet" else ("argoproj.io", "rollouts")
        )
        try:
            return self.b.custom.get_namespaced_custom_object(group, "v1alpha1", self.ns, plural, SERVICE)
        except client.ApiException:
            return {}

    def _stable(self) -> str:
        st = self._obj().get("status") or {}
        return st.get("stableRevision" if self.kind == "chatfleet" else "stableRS") or ""

    def outcome(self) -> str:
        """'promoted', 'rolled back', or '' while the release (or the first deployment) runs.

        Only a status that has seen the latest spec counts (observedGeneration), so the verdict of the
        previous release is never read as this one's.
        """
        obj = self._obj()
        st = obj.get("status") or {}
        if str(st.get("observedGeneration")) != str((obj.get("metadata") or {}).get("generation")):
            return ""
        if self.kind == "chatfleet":
            if (st.get("release") or {}).get("phase") == "RolledBack":
                return "rolled back"
            conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
            if st.get("stableRevision") not in (None, self.before) and not st.get("release"):
                return "promoted" if conds.get("Ready") == "True" else ""
            return ""
        if st.get("abort"):
            return "rolled back"
        stable = st.get("stableRS")
        if (
            stable
            and stable != self.before
            and stable == st.get("currentPodHash")
            and st.get("phase") == "Healthy"
        ):
            return "promoted"
        return ""

    def reason(self) -> str:
        """What the tool said about the end of the release."""
        st = self._obj().get("status") or {}
        if self.kind == "chatfleet":
            return st.get("abortReason") or (st.get("release") or {}).get("message") or ""
        return st.get("message") or ""

    def passed_once(self) -> bool:
        """The release's analysis has passed at least one measurement (every metric, for Argo)."""
        if self.kind == "chatfleet":
            rel = (self._obj().get("status") or {}).get("release") or {}
            return (rel.get("analysis") or {}).get("successful", 0) >= 1
        pod_hash = (self._obj().get("status") or {}).get("currentPodHash")
        runs = self.b.custom.list_namespaced_custom_object(
            "argoproj.io",
            "v1alpha1",
            self.ns,
            "analysisruns",
            label_selector=f"rollouts-pod-template-hash={pod_hash}",
        )
        for run in runs.get("items") or []:
            results = (run.get("status") or {}).get("metricResults") or []
            if len(results) == 3 and all(r.get("successful", 0) >= 1 for r in results):
                return True
        return False

    def serving(self, rev: str) -> bool:
        """A Ready pod of `rev` is behind the Service."""
        return rev in ready_revs(self.watcher.now())

    def stop(self) -> None:
        self.watcher.stop()


# ---- the platform --------------------------------------------------------------------------------------
class Bench:
    """The platform, both operators, and per scenario one Prometheus + a trafficsim per tool."""

    def __init__(self) -> None:
        self.cluster = Cluster(REPO / ".work" / "bench-rollout", progress=lambda m: None)
        self.open: list[Any] = []
        self.namespaces: list[str] = []
        self.api: client.ApiClient
        self.custom: client.CustomObjectsApi

    def up(self) -> None:
        """Cluster (8 kwok nodes: 32 H100 GPUs), both CRDs, both operators."""
        argo = argo_binaries()
        say("starting the local platform")
        self.cluster.up(nodes=8)
        self.api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self.custom = client.CustomObjectsApi(self.api)
        self.cluster.install_crd(REPO / "crds", CHATBOT_CRD_NAME)
        for crd in (
            "rollout",
            "analysis-template",
            "analysis-run",
            "cluster-analysis-template",
            "experiment",
        ):
            name = crd.replace("-", "") + "s.argoproj.io"  # analysis-run -> analysisruns.argoproj.io
            self.cluster.install_crd(argo / "crds" / f"{crd}-crd.yaml", name)
        self.cluster.start_extra(
            "operator", [sys.executable, "-m", "chatfleet_operator.cli", "run", *LOCAL_ANALYSIS_ARGS]
        )
        self.cluster.start_extra(
            "argo-rollouts",
            [
                str(argo / "rollouts-controller"),
                f"--kubeconfig={self.cluster.kubeconfig}",
                "--leader-elect=false",
                f"--metricsPort={procs.free_port()}",
                f"--healthzPort={procs.free_port()}",
            ],
            env={**self.cluster.env, "POD_NAMESPACE": "argo-rollouts"},
        )
        time.sleep(3)

    def down(self) -> None:
        """Stop everything started here."""
        for thing in self.open:
            thing.stop()
        self.cluster.down()

    def pair(self, scenario: str, interval: int, kinds: tuple[str, ...] = TOOLS) -> dict[str, Tool]:
        """One namespace, trafficsim and bot per tool, one Prometheus scraping both sims."""
        sims = {k: TrafficSim(f"{k}-{scenario}", SERVICE).start() for k in kinds}
        for sim in sims.values():
            sim.healthy(20)
            self.open.append(sim)
        prom = services.Prometheus(
            self.cluster.workdir / f"prom-{scenario}", targets=[s.target for s in sims.values()]
        ).start()
        self.open.append(prom)
        tools = {}
        for k in kinds:
            ns = f"{k}-{scenario}"
            self.cluster.kubectl("create", "namespace", ns)
            self.namespaces.append(ns)
            tools[k] = Tool(self, k, ns, prom.url, sims[k])
            self.open.append(tools[k])
        return tools

    def settle(self, tools: dict[str, Tool], steps: list[tuple[int, int]], interval: int) -> None:
        """Deploy revision r0 of both and wait until it serves with all replicas."""
        for t in tools.values():
            t.deploy("r0", steps, interval)
        for t in tools.values():
            wait_for(t.outcome, 120, f"{t.label} r0 deployed")
            wait_for(lambda t=t: only_ready("r0", REPLICAS)(t.watcher.now()), 60, f"{t.label} r0 serving")

    def release_pair(self, scenario: str) -> None:
        """Drop a scenario's namespaces (its bots go away with them)."""
        for ns in [n for n in self.namespaces if n.endswith(f"-{scenario}")]:
            self.cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ---- the scenarios -------------------------------------------------------------------------------------
def bad_canary(b: Bench, run: int, bad: str) -> dict[str, Any]:
    """Rows 1-2: a canary at 20% that serves and has passed a measurement turns bad; time to no canary
    endpoint."""
    scenario = f"{bad}-{run}"
    tools = b.pair(scenario, INTERVAL, (*TOOLS, SAME_COUNT))
    b.settle(tools, HOLD, INTERVAL)
    for t in tools.values():
        t.deploy("r1", HOLD, INTERVAL)
    for t in tools.values():
        wait_for(lambda t=t: t.serving("r1") and t.passed_once(), 120, f"{t.label}: canary serving, one pass")
    time.sleep(INTERVAL * (run % 3) / 3)  # spread the bad moment over the interval
    knobs = {"error_rate": 0.2} if bad == "errors" else {"latency_ms": 3000}
    t0 = {}
    for k, t in tools.items():
        t.sim.set("canary", **knobs)
        t0[k] = time.monotonic()
    out = {}
    for k, t in tools.items():
        end = wait_for(
            lambda t=t, k=k: t.watcher.first_after(t0[k], no_ready_pod_of("r1")), 180, f"{t.label} rollback"
        )
        out[k] = {
            "seconds": round(end - t0[k], 1),
            "outcome": wait_for(t.outcome, 30, "verdict"),
            "reason": t.reason(),
        }
    b.release_pair(scenario)
    return out


def never_ready(b: Bench, run: int) -> dict[str, Any]:
    """Row 3: a release whose pods never get Ready; time from the spec change to the canary pods deleted."""
    scenario = f"unready-{run}"
    tools = b.pair(scenario, INTERVAL)
    b.settle(tools, HOLD, INTERVAL)
    t0 = {}
    for k, t in tools.items():
        t.deploy("r1", HOLD, INTERVAL, unready=True)
        t0[k] = time.monotonic()
    out = {}
    for k, t in tools.items():
        seen = wait_for(lambda t=t, k=k: t.watcher.first_after(t0[k], has_pod_of("r1")), 60, "canary pod")
        end = wait_for(
            lambda t=t, seen=seen: t.watcher.first_after(seen, no_pod_of("r1")),
            PROGRESS_DEADLINE + 180,
            f"{t.label} abort",
        )
        ever_ready = any("r1" in ready_revs(s) for _, s in t.watcher.history)
        out[k] = {
            "seconds": round(end - t0[k], 1),
            "outcome": wait_for(t.outcome, 30, "verdict"),
            "reason": t.reason(),
            "canary_ever_ready": ever_ready,
        }
    b.release_pair(scenario)
    return out


def five_step(b: Bench, run: int) -> dict[str, Any]:
    """Row 4: a healthy 5-step canary, both released at once; time to promoted with only new pods Ready."""
    scenario = f"five-{run}"
    tools = b.pair(scenario, 5)
    b.settle(tools, FIVE, 5)
    t0 = {}
    for k, t in tools.items():
        t.deploy("r1", FIVE, 5)
        t0[k] = time.monotonic()
    out = {}
    for k, t in tools.items():
        verdict = wait_for(t.outcome, 600, f"{t.label} 5-step release")
        said = time.monotonic()  # polled every 0.2 s
        if verdict == "promoted":
            served = wait_for(
                lambda t=t, k=k: t.watcher.first_after(t0[k], only_ready("r1", REPLICAS)), 60, "r1 only"
            )
            end = max(said, served)
        else:
            end = said
        out[k] = {"seconds": round(end - t0[k], 1), "outcome": verdict}
    b.release_pair(scenario)
    return out


def healthy_releases(b: Bench) -> dict[str, Any]:
    """False rollbacks: HEALTHY_RELEASES healthy releases per tool, the two tools' series side by side."""
    tools = b.pair("healthy", 2)
    b.settle(tools, SHORT, 2)
    results: dict[str, dict[str, Any]] = {}

    def series(k: str, t: Tool) -> None:
        outcomes: list[str] = []
        durations: list[float] = []
        reasons: list[str] = []
        try:
            releases(t, outcomes, durations, reasons)
        except Exception as exc:  # reported in the JSON and the table, not lost in a thread
            reasons.append(f"stopped after {len(outcomes)} releases: {exc}")
        results[k] = {
            "releases": len(outcomes),
            "false_rollbacks": sum(o != "promoted" for o in outcomes),
            "mean_release_seconds": round(sum(durations) / max(1, len(durations)), 1),
            "rollback_reasons": reasons,
        }

    def releases(t: Tool, outcomes: list[str], durations: list[float], reasons: list[str]) -> None:
        for i in range(1, HEALTHY_RELEASES + 1):
            t0 = time.monotonic()
            t.deploy(f"r{i}", SHORT, 2)
            verdict = wait_for(t.outcome, 300, f"{t.label} release r{i}")
            durations.append(time.monotonic() - t0)
            outcomes.append(verdict)
            if verdict != "promoted":
                reasons.append(f"r{i}: {t.reason()}")
                # the next release starts from the rolled-back state: wait for r{i-1} alone to serve
                wait_for(
                    lambda t=t, i=i: only_ready(f"r{i - 1}", REPLICAS)(t.watcher.now()), 60, "rollback done"
                )
            else:
                wait_for(
                    lambda t=t, i=i: only_ready(f"r{i}", REPLICAS)(t.watcher.now()), 60, "promotion done"
                )
            say(f"{t.label}: healthy release {i}/{HEALTHY_RELEASES}: {verdict} in {durations[-1]:.1f}s")

    threads = [threading.Thread(target=series, args=(k, t)) for k, t in tools.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    b.release_pair("healthy")
    return results


# ---- the report ----------------------------------------------------------------------------------------
def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tool: each run's seconds and outcome, the mean and the max; Chatfleet / Argo of the means."""
    out: dict[str, Any] = {}
    for k in runs[0]:
        secs = [r[k]["seconds"] for r in runs]
        out[k] = {
            "runs": [r[k] for r in runs],
            "mean_seconds": round(sum(secs) / len(secs), 1),
            "max_seconds": round(max(secs), 1),
            "outcomes": sorted({r[k]["outcome"] for r in runs}),
        }
    out["ratio"] = round(out["chatfleet"]["mean_seconds"] / out["argo"]["mean_seconds"], 2)
    if SAME_COUNT in out:
        out["ratio_same_count"] = round(out["chatfleet"]["mean_seconds"] / out[SAME_COUNT]["mean_seconds"], 2)
    return out


def line(what: str, r: dict[str, Any]) -> str:
    """A progress line of one run: each tool's seconds and outcome."""
    return f"{what}: " + ", ".join(f"{LABELS[k]} {r[k]['seconds']}s ({r[k]['outcome']})" for k in r)


def main() -> int:
    """Run the scenarios; print the table; write bench-results/rollout.json."""
    results: dict[str, Any] = {
        "argo_rollouts_version": read_versions()["ARGO_ROLLOUTS_VERSION"],
        "interval_seconds": INTERVAL,
        "failure_limit": FAILURE_LIMIT,
        "consecutive_error_limit": CONSECUTIVE_ERROR_LIMIT,
        "progress_deadline_seconds": PROGRESS_DEADLINE,
        "replicas": REPLICAS,
        "thresholds": {
            "error_rate_percent": ERROR_RATE_PERCENT,
            "latency_p99_ms": LATENCY_P99_MS,
            "ttft_p99_ms": TTFT_P99_MS,
        },
        "rollback_runs": ROLLBACK_RUNS,
    }
    started = time.monotonic()
    b = Bench()
    try:
        b.up()
        for bad in ("errors", "latency"):
            runs = []
            for run in range(ROLLBACK_RUNS):
                runs.append(bad_canary(b, run, bad))
                say(line(f"canary bad on {bad}, run {run + 1}", runs[-1]))
            results[f"bad_{bad}"] = summarise(runs)
        runs = []
        for run in range(ROLLBACK_RUNS):
            runs.append(never_ready(b, run))
            say(line(f"canary never Ready, run {run + 1}", runs[-1]))
        results["never_ready"] = summarise(runs)
        runs = []
        for run in range(ROLLBACK_RUNS):
            runs.append(five_step(b, run))
            say(line(f"healthy 5-step canary, run {run + 1}", runs[-1]))
        results["five_step"] = summarise(runs)
        results["five_step"]["sum_of_pauses_seconds"] = sum(p for _, p in FIVE)
        results["false_rollbacks"] = healthy_releases(b)
    finally:
        b.down()
    results["wall_seconds"] = round(time.monotonic() - started)
    out = REPO / "bench-results" / "rollout.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    return 0


def print_table(r: dict[str, Any]) -> None:
    """The side-by-side table: Chatfleet, Argo Rollouts, Chatfleet / Argo, the goal; then Argo at the
    same count of failed measurements (rows 1-2)."""

    def cell(row: dict[str, Any], k: str, expected: str) -> str:
        if k not in row:
            return ""
        x = row[k]
        odd = "/".join(o for o in x["outcomes"] if o != expected).upper()
        return f"{x['mean_seconds']}s (max {x['max_seconds']}s)" + (f" {odd}" if odd else "")

    same = f"Argo, failureLimit {r['failure_limit'] - 1}"
    rows = [
        ("", "Chatfleet", "Argo Rollouts v1.10.2", "Chatfleet/Argo", "goal <= Argo", same, "Chatfleet/that")
    ]
    named = (
        ("bad_errors", "1. canary bad on errors -> no canary endpoint", "rolled back"),
        ("bad_latency", "2. canary bad on latency -> no canary endpoint", "rolled back"),
        (
            "never_ready",
            f"3. canary never Ready -> canary pods deleted (deadline {r['progress_deadline_seconds']}s)",
            "rolled back",
        ),
        (
            "five_step",
            f"4. healthy 5-step canary -> promoted (pauses {r['five_step']['sum_of_pauses_seconds']}s)",
            "promoted",
        ),
    )
    for key, name, expected in named:
        row = r[key]
        rows.append(
            (
                name,
                cell(row, "chatfleet", expected),
                cell(row, "argo", expected),
                f"{row['ratio']:.2f}x",
                "met" if row["ratio"] <= 1 else "MISSED",
                cell(row, SAME_COUNT, expected),
                f"{row['ratio_same_count']:.2f}x" if "ratio_same_count" in row else "",
            )
        )
    fr = r["false_rollbacks"]
    rows.append(
        (
            f"False rollbacks over {fr['chatfleet']['releases']} healthy releases",
            str(fr["chatfleet"]["false_rollbacks"]),
            str(fr["argo"]["false_rollbacks"]),
            "",
            "met" if fr["chatfleet"]["false_rollbacks"] == 0 else "MISSED (goal 0)",
            "",
            "",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip())
    print(
        f"interval {r['interval_seconds']}s, failureLimit {r['failure_limit']} for both (Chatfleet rolls back at "
        f"failed >= failureLimit, Argo aborts at failed > failureLimit); rows 1-4 are means of "
        f"{r['rollback_runs']} runs, Chatfleet and Argo side by side; wall {r['wall_seconds']}s"
    )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (subprocess.CalledProcessError, PlatformError, RuntimeError) as e:
        print(f"bench failed: {e}", file=sys.stderr)
        sys.exit(1)
