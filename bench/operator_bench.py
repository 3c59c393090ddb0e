"""Benchmark the operator on the local platform; prints a table and writes bench-results/operator.json.

Figures: time for 200 and for 1,000 ChatbotServices applied at once to all be Ready (goal: 1,000 in
<= 60 s on 2 cores); reconcile pass latency p50/p99; API write requests per ChatbotService at creation
(goal <= 3) and per minute at steady state (goal: 0); operator memory; where the time went (CPU seconds
of each platform process and of the operator, and the API server's requests by verb and resource, from
the creation to all Ready). Side by side, in the same run, with no operator running: the same number of
single-GPU Deployments becoming available, and of Deployments plus a Service each; and the fair floor:
the operator's own objects for the same ChatbotServices (copied from what it wrote for one, renamed),
created directly with no operator running, reported as the operator's time and machine CPU over the
floor's. Readiness is seen through one watch (not a kubectl poll), and the machine's whole CPU (every
process, /proc/stat) is counted beside each platform component's.

Writes are counted two ways and added: the operator's own counter (every apply, delete, status patch,
event; read through SIGUSR1 -> --stats-file) plus kopf's bookkeeping patches on ChatbotServices (from
the API server's apiserver_request_total, non-status PATCHes of chatbotservices).

With --custom-resource-floor, a third row beside them: the custom-resource floor, the fair floor with each
ChatbotService POSTed too and its status written once, when its Deployment is available, by the
benchmark's client, no operator running: what any operator of the custom resource costs the cluster at
least (the operator's one status write of a ChatbotService whose pods are Ready within its first-status
hold; a slower one gets a second). The operator's ratio then splits in two: the custom resources over the
fair floor, and the operator over the custom-resource floor (its watches, passes and decisions). Every row
starts on a cluster whose nodes have settled (a new cluster's nodes are written about twice each in their
first minute).

With --apiserver-profile the API server's CPU is profiled over each row (its /debug/pprof, in back-to-back
slices merged by `go tool pprof`) and the rows compared by function: bench-results/apiserver-profile-<n>.txt.

With --profile the operator's process is sampled by py-spy (installed into the venv on first use) while
the fleets are created: bench-results/operator-profile.txt (py-spy's collapsed stacks) and a summary of
where its CPU went in operator.json. The sampler's own CPU counts in the machine's, so a profiled run's
ratios are not the figures to quote.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import kubernetes
from apiserver_profile import ApiServerProfile, top
from chatfleet_platform.cluster.cluster import NODE_LEASE_SECONDS, Cluster
from chatfleet_platform.common.config import CHATBOT_CRD_FILE, CHATBOT_CRD_NAME
from percentiles import operator_figures

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench-results"
#: --apiserver-profile: the folder of each profiled row's API server CPU profile (None: not profiled).
APISERVER_PROFILES: Path | None = None
#: Each profiled row's merged profile, by row, for the comparison written at the end.
PROFILED_ROWS: dict[str, Path] = {}


@contextlib.contextmanager
def apiserver_profiled(cluster: Cluster, row: str):
    """Profile the API server's CPU while the block runs (with --apiserver-profile; else nothing)."""
    if APISERVER_PROFILES is None:
        yield
        return
    profile = ApiServerProfile(cluster.binaries.kubectl, cluster.env, APISERVER_PROFILES / row)
    with profile:
        yield
    PROFILED_ROWS[row] = profile.merged()


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[bench-operator] {msg}", file=sys.stderr, flush=True)


def chatbot(name: str) -> dict:
    """The smallest useful ChatbotService (1 replica, 1 GPU)."""
    return {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "hf://org/tiny"},
            "resources": {"cpu": "1", "memory": "4Gi", "shmSize": "1Gi"},
        },
    }


def bare_deployment(name: str) -> dict:
    """A single-GPU Deployment like the operator's, without the operator."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "triton",
                            "image": "ghcr.io/chatfleet/chatfleet-runtime:0.1.0",
                            "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "4Gi"}},
                        }
                    ],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
        },
    }


def bare_service(name: str) -> dict:
    """The chat Service the operator makes for each ChatbotService, without the operator."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "chat", "port": 8080, "targetPort": 8080}]},
    }


def client(cluster: Cluster) -> kubernetes.client.ApiClient:
    """A Kubernetes client of the cluster for 16 threads."""
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.configuration.connection_pool_maxsize = 16
    return api


def send(api: kubernetes.client.ApiClient, method: str, path: str, doc: dict, content_type: str) -> None:
    """One request with a JSON body; raises on an error status."""
    _, url, headers, body, _ = api.param_serialize(
        method,
        path,
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=doc,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, header_params=headers, body=body, _request_timeout=60)
    response.read()
    if response.status >= 300:
        raise RuntimeError(f"{method} {path}: {response.status} {response.data[:300]!r}")


def create_all(cluster: Cluster, namespace: str, docs: list[dict], tmp: Path) -> float:
    """POST every document at once from 16 client threads (like a GitOps sync); seconds the client took."""
    api = client(cluster)

    def create(doc: dict) -> None:
        group_version = doc["apiVersion"]
        prefix = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        plural = doc["kind"].lower() + "s"  # every kind created here pluralises so
        send(api, "POST", f"{prefix}/namespaces/{namespace}/{plural}", doc, "application/json")

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, docs))
    return time.monotonic() - t0


def is_ready(kind: str, obj: dict) -> bool:
    """A ChatbotService with Ready=True, a Deployment with its one replica available."""
    status = obj.get("status") or {}
    if kind == "chatbotservices":
        return any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
        )
    return status.get("availableReplicas") == 1


def wait_all_ready(
    cluster: Cluster,
    namespace: str,
    kind: str,
    n: int,
    t0: float,
    timeout: float,
    on_ready: Callable[[dict], None] | None = None,
) -> float | None:
    """Seconds from t0 until all n are ready, seen through a list and then a watch (no polling that would
    load the API server); None on timeout."""
    api = client(cluster)
    if kind == "chatbotservices":
        custom = kubernetes.client.CustomObjectsApi(api)
        args = ("chatfleet.io", "v1alpha1", namespace, "chatbotservices")
        lister = lambda **kw: custom.list_namespaced_custom_object(*args, **kw)  # noqa: E731
    else:
        apps = kubernetes.client.AppsV1Api(api)
        lister = lambda **kw: apps.list_namespaced_deployment(namespace, **kw)  # noqa: E731
    return count_until_ready(lister, namespace, kind, n, t0, timeout, on_ready)


def count_until_ready(
    lister,
    namespace: str,
    kind: str,
    n: int,
    t0: float,
    timeout: float,
    on_ready: Callable[[dict], None] | None = None,
) -> float | None:
    """The watch behind wait_all_ready: a list (in pages), then watches from its resourceVersion, each
    minute's new one resuming at the last version seen (bookmarks asked for); after 410 Gone, a list again.
    A watch with no version starts by sending every object, and at 10,000 ChatbotServices on the saturated
    machine that took longer than the watch's minute: cut off and started again each time, the count fell
    minutes behind the objects (5,000 counted when 8,037 were Ready). `on_ready` is called with each object
    the first time it is seen ready."""
    ready: set[str] = set()
    ever: set[str] = set()
    last = -1
    version: str | None = None

    def seen(obj: dict, event_type: str = "ADDED") -> float | None:
        nonlocal last
        name = obj["metadata"]["name"]
        if event_type != "DELETED" and is_ready(kind, obj):
            if on_ready is not None and name not in ever:
                on_ready(obj)
            ready.add(name)
            ever.add(name)
        else:
            ready.discard(name)
        if len(ready) != last and (len(ready) % max(1, n // 10) == 0 or len(ready) >= n):
            log(f"{namespace}: {len(ready)}/{n} ready after {time.monotonic() - t0:.1f}s")
        last = len(ready)
        return time.monotonic() - t0 if len(ready) >= n else None

    while time.monotonic() - t0 < timeout:
        if version is None:
            ready.clear()
            page: dict = {}
            while True:  # plain dicts, as the watch's (the client's model objects cost more CPU)
                resp = lister(limit=500, _preload_content=False, **page)
                listed = json.loads(resp.data)
                for obj in listed.get("items", []):
                    if (done := seen(obj)) is not None:
                        return done
                token = listed["metadata"].get("continue")
                if not token:
                    break
                page = {"_continue": token}
            version = listed["metadata"]["resourceVersion"]
        remaining = max(1, int(timeout - (time.monotonic() - t0)))
        watch = kubernetes.watch.Watch()
        try:
            for event in watch.stream(
                lister,
                timeout_seconds=min(remaining, 60),
                allow_watch_bookmarks=True,
                resource_version=version,
                deserialize=False,
            ):
                obj = event["object"]
                version = obj["metadata"].get("resourceVersion") or version
                if event["type"] != "BOOKMARK" and (done := seen(obj, event["type"])) is not None:
                    watch.stop()
                    return done
        except kubernetes.client.ApiException as exc:
            if exc.status != 410:
                raise
            version = None  # too old: list again
    return None


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric in a Prometheus text exposition: (labels, value) each."""
    samples = []
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels = dict(
            (key, value.strip('"'))
            for key, value in (
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
                if "=" in part
            )
        )
        samples.append((labels, float(line.rsplit(" ", 1)[1])))
    return samples


def api_requests(cluster: Cluster) -> dict[str, int]:
    """The API server's request counts by "VERB resource[/subresource]" (apiserver_request_total), and the
    watch events it sent by resource, every watcher together: "WATCH EVENTS pods" (count) and "WATCH KiB
    pods" (their size; apiserver_watch_events_total, apiserver_watch_events_sizes_sum); beside them the
    watches started ("WATCH STARTS pods"), the watchers it closed for falling behind ("WATCH TERMINATED
    pods", apiserver_terminated_watchers_total) and the events its watch cache fanned out
    ("WATCH DISPATCHED pods", each once, apiserver_watch_cache_events_dispatched_total)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    counts: dict[str, int] = {}
    for labels, value in metric_samples(text, "apiserver_request_total"):
        verb, resource, sub = (
            labels.get("verb", ""),
            labels.get("resource", ""),
            labels.get("subresource", ""),
        )
        if verb == "CONNECT" or not resource:
            continue
        key = f"{verb} {resource}{'/' + sub if sub else ''}"
        if verb == "WATCH":  # watches started (a restarted watch counts again)
            key = f"WATCH STARTS {resource}"
        counts[key] = counts.get(key, 0) + int(value)
    for metric, what, scale in (
        ("apiserver_watch_events_total", "WATCH EVENTS", 1),
        ("apiserver_watch_events_sizes_sum", "WATCH KiB", 1024),
        ("apiserver_terminated_watchers_total", "WATCH TERMINATED", 1),
        ("apiserver_watch_cache_events_dispatched_total", "WATCH DISPATCHED", 1),
    ):
        for labels, value in metric_samples(text, metric):
            key = f"{what} {labels.get('resource') or labels.get('kind', '?')}"
            counts[key] = counts.get(key, 0) + int(value / scale)
    return counts


#: The platform's processes whose CPU time the benchmark reports (matched in /proc/PID/cmdline).
COMPONENTS = (
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "chatfleet_operator.cli",
)


def cpu_seconds(marker: str) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each platform component and the operator of this
    benchmark (processes whose command line holds `marker`, the benchmark's own folder)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys(COMPONENTS, 0.0)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = next((c for c in COMPONENTS if c in cmd), None)
        if name is not None and marker in cmd and "operator_bench" not in cmd:
            out[name] += (int(fields[11]) + int(fields[12])) / tick
    return out


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy (every process: the benchmark's client and its
    watches too), from /proc/stat: all but idle and iowait."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def request_figures(after: dict, before: dict) -> dict:
    """The API server's requests (the 15 largest) and the watch events it sent, from one row's start to
    its end (api_requests before and after)."""
    requests = {k: v for k, v in after.items() if not k.startswith("WATCH ")}
    watch = {k: v for k, v in after.items() if k.startswith("WATCH ")}
    return {"api_requests_to_ready": delta(requests, before, top=15), "watch_to_ready": delta(watch, before)}


def delta(after: dict, before: dict, top: int | None = None) -> dict:
    """after - before per key, largest first (the first `top`), zeros dropped."""
    diff = {k: round(v - before.get(k, 0), 1) for k, v in after.items() if v - before.get(k, 0)}
    return dict(sorted(diff.items(), key=lambda kv: -kv[1])[:top])


def stage_seconds(cluster: Cluster, namespace: str) -> dict[str, dict[str, float]]:
    """Per ChatbotService, from the objects' own timestamps (1 s resolution): created -> its Deployment
    created (the operator's first pass), Deployment created -> Ready; p50 / p90 / max of each."""
    from datetime import datetime

    def when(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    def items(kind: str) -> list[dict]:
        return json.loads(cluster.kubectl("get", kind, "-o", "json", namespace=namespace).stdout)["items"]

    deployed = {d["metadata"]["name"]: when(d["metadata"]["creationTimestamp"]) for d in items("deployments")}
    first, ready = [], []
    for cbs in items("chatbotservices"):
        name = cbs["metadata"]["name"]
        cond = next((c for c in cbs["status"].get("conditions", []) if c["type"] == "Ready"), {})
        if name in deployed and cond.get("status") == "True":
            first.append(deployed[name] - when(cbs["metadata"]["creationTimestamp"]))
            ready.append(when(cond["lastTransitionTime"]) - deployed[name])

    def spread(values: list[float]) -> dict[str, float]:
        values = sorted(values) or [0.0]
        pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
        return {"p50": pick(0.5), "p90": pick(0.9), "max": values[-1]}

    return {"created_to_deployment": spread(first), "deployment_to_ready": spread(ready)}


def cbs_kopf_patches(cluster: Cluster) -> int:
    """Non-status write requests on chatbotservices seen by the API server (kopf's bookkeeping)."""
    total = 0
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if not line.startswith("apiserver_request_total{") or 'resource="chatbotservices"' not in line:
            continue
        if 'subresource=""' in line and any(f'verb="{v}"' in line for v in ("PATCH", "PUT", "APPLY")):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


class Operator:
    """The operator as a subprocess; figures via SIGUSR1 -> stats file."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.stats_file = tmp / "operator-stats.json"
        self.log_file = tmp / "operator.log"
        env = {**os.environ, **cluster.env, "PYTHONUNBUFFERED": "1"}
        with open(self.log_file, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chatfleet_operator.cli", "run", "--stats-file", str(self.stats_file)],
                cwd=REPO,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while "Initial authentication has finished" not in self.log_file.read_text(errors="replace"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"operator did not start; see {self.log_file}")
            time.sleep(0.2)

    def stats(self) -> dict:
        """Current figures of the running operator."""
        before = self.stats_file.stat().st_mtime_ns if self.stats_file.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.stats_file.exists() and self.stats_file.stat().st_mtime_ns != before:
                break
            time.sleep(0.05)
        data = operator_figures(json.loads(self.stats_file.read_text()))
        data["rss_mib"] = rss_mib(self.proc.pid)
        return data

    def stop(self) -> None:
        """SIGTERM by PID."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


PY_SPY = "py-spy==0.4.3"


def start_profiler(pid: int, out: Path) -> subprocess.Popen:
    """py-spy sampling a running process into collapsed stacks: only the thread holding the GIL, so the
    samples are where its Python CPU went (waiting on the network or a lock is not counted)."""
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        log(f"installing {PY_SPY} (bench only)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", PY_SPY], check=True)
    cmd = [str(exe), "record", "--pid", str(pid), "--rate", "50", "--nonblocking", "--gil", "--format", "raw"]
    return subprocess.Popen([*cmd, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(proc: subprocess.Popen, out: Path) -> dict:
    """Stop the sampler (SIGINT writes its file) and summarise the samples."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    return profile_summary(out.read_text() if out.exists() else "")


def profile_summary(collapsed: str, top: int = 25) -> dict:
    """Where sampled CPU went, from py-spy's collapsed stacks ("frame;frame;... count" lines, the leaf
    last): each function's share of the samples inclusive (on the stack at all) and self (the leaf)."""
    total, inclusive, self_time = 0, {}, {}
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        self_time[frames[-1]] = self_time.get(frames[-1], 0) + n

    def shares(counts: dict) -> dict:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return {frame: round(100 * n / total, 1) for frame, n in ranked}

    return (
        {"samples": total, "inclusive_pct": shares(inclusive), "self_pct": shares(self_time)} if total else {}
    )


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def total_writes(stats: dict) -> int:
    """All write requests the operator counted."""
    return sum(stats.get("writes", {}).values())


def run_fleet(cluster: Cluster, op: Operator, n: int, tmp: Path, steady_s: float, timeout: float) -> dict:
    """Apply n ChatbotServices at once, wait for all Ready, then watch a quiet steady state."""
    ns = f"bench-{n}"
    cluster.kubectl("create", "namespace", ns)
    s0, k0 = op.stats(), cbs_kopf_patches(cluster)
    r0, c0, m0 = api_requests(cluster), cpu_seconds(str(tmp)), machine_cpu_seconds()
    t0 = time.monotonic()
    # the figures are read inside the profile's block: leaving it waits for its last slice to end
    with apiserver_profiled(cluster, f"operator-{n}"):
        apply_s = create_all(cluster, ns, [chatbot(f"bot-{i}") for i in range(n)], tmp)
        ready_s = wait_all_ready(cluster, ns, "chatbotservices", n, t0, timeout)
        r1, c1, m1 = api_requests(cluster), cpu_seconds(str(tmp)), machine_cpu_seconds()
    stages = stage_seconds(cluster, ns)
    time.sleep(5)  # late status writes belong to creation
    s1, k1 = op.stats(), cbs_kopf_patches(cluster)
    log(f"{ns}: steady state for {steady_s:.0f}s")
    time.sleep(steady_s)
    s2, k2 = op.stats(), cbs_kopf_patches(cluster)
    creation = (total_writes(s1) - total_writes(s0)) + (k1 - k0)
    steady = (total_writes(s2) - total_writes(s1)) + (k2 - k1)
    by_kind = {k: v - s0.get("writes", {}).get(k, 0) for k, v in s1.get("writes", {}).items()}
    return {
        "chatbotservices": n,
        "client_create_s": round(apply_s, 1),
        "all_ready_s": round(ready_s, 1) if ready_s is not None else None,
        "writes_per_cbs_at_creation": round(creation / n, 2),
        "creation_writes_by_kind": {**{k: v for k, v in by_kind.items() if v}, "kopf bookkeeping": k1 - k0},
        "steady_writes_per_min": round(steady * 60 / steady_s, 2),
        "operator_rss_mib": round(s2["rss_mib"], 1),
        "operator_gc_seconds_at_creation": round(s1.get("gc_seconds", 0.0) - s0.get("gc_seconds", 0.0), 1),
        "passes": s2["passes"] - s0["passes"],
        # where the time went, from the creation to all Ready: CPU seconds per process, API requests
        "cpu_seconds_to_ready": delta(c1, c0),
        "machine_cpu_seconds_to_ready": round(m1 - m0, 1),
        **request_figures(r1, r0),
        "stage_seconds": stages,
    }


def restart_figures(stats: dict, kopf_patches: int, fleet: int) -> dict:
    """What a new operator process wrote over a fleet that was Ready (its stats count from its start): its
    writes by kind (the goal is none), kopf's bookkeeping patches meanwhile, and its passes (>= fleet: it
    passed over every ChatbotService)."""
    writes = {k: v for k, v in stats.get("writes", {}).items() if v}
    return {
        "chatbotservices": fleet,
        "passes": stats.get("passes", 0),
        "writes": sum(writes.values()) + kopf_patches,
        "writes_by_kind": {**writes, "kopf bookkeeping": kopf_patches},
    }


def restart(cluster: Cluster, tmp: Path, fleet: int, settle_s: float, timeout: float) -> dict:
    """Start a new operator over the Ready fleets (the old one stopped): wait until it has passed over every
    ChatbotService, then `settle_s` more, and count what it wrote."""
    k0 = cbs_kopf_patches(cluster)
    t0 = time.monotonic()
    op = Operator(cluster, tmp)
    try:
        deadline = t0 + timeout
        while (stats := op.stats())["passes"] < fleet and time.monotonic() < deadline:
            time.sleep(1)
        passed_s = time.monotonic() - t0
        time.sleep(settle_s)
        figures = restart_figures(op.stats(), cbs_kopf_patches(cluster) - k0, fleet)
        figures["seconds_to_pass_over_all"] = round(passed_s, 1) if stats["passes"] >= fleet else None
        return figures
    finally:
        op.stop()


def baseline(cluster: Cluster, n: int, tmp: Path, timeout: float, services: bool = False) -> dict:
    """n single-GPU Deployments (and, with `services`, a Service each), no operator: seconds until all
    Deployments are available."""
    ns = f"baseline-{n}{'-svc' if services else ''}"
    cluster.kubectl("create", "namespace", ns)
    docs = [bare_deployment(f"bare-{i}") for i in range(n)]
    if services:  # interleaved, as a GitOps sync of n (Deployment, Service) pairs would send them
        docs = [d for i, dep in enumerate(docs) for d in (dep, bare_service(f"bare-{i}"))]
    return {
        "deployments": n,
        "services": n if services else 0,
        **deployments_to_available(cluster, ns, docs, n, tmp, timeout),
    }


def deployments_to_available(
    cluster: Cluster,
    ns: str,
    docs: list[dict],
    n: int,
    tmp: Path,
    timeout: float,
    writer: StatusWriter | None = None,
) -> dict:
    """Create `docs` in `ns` (no operator) and time them until the n Deployments are available (and, with
    a `writer`, their ChatbotServices' status written when available): the client's seconds, all
    available, CPU per component and of the machine, API requests."""
    r0, c0, m0 = api_requests(cluster), cpu_seconds(str(tmp)), machine_cpu_seconds()
    t0 = time.monotonic()
    on_ready = writer.available if writer else None
    with apiserver_profiled(cluster, ns):
        apply_s = create_all(cluster, ns, docs, tmp)
        ready_s = wait_all_ready(cluster, ns, "deployments", n, t0, timeout, on_ready)
        if writer is not None and ready_s is not None:
            writer.wait()
            ready_s = time.monotonic() - t0
        r1, c1, m1 = api_requests(cluster), cpu_seconds(str(tmp)), machine_cpu_seconds()
    return {
        "client_create_s": round(apply_s, 1),
        "all_ready_s": round(ready_s, 1) if ready_s else None,
        "cpu_seconds_to_ready": delta(c1, c0),
        "machine_cpu_seconds_to_ready": round(m1 - m0, 1),
        **request_figures(r1, r0),
    }


#: Server-written metadata and status left out when the operator's objects are created again directly.
SERVER_FIELDS = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "ownerReferences",
)


def fair_manifests(cluster: Cluster, namespace: str, owner: str) -> list[dict]:
    """What the operator wrote for one ChatbotService (`owner` in `namespace`), as it would be created
    again without it: every object it owns, server fields, status and the Service's allocated addresses
    dropped. Pods and ReplicaSets are the Deployments' (the controllers make them in both runs)."""
    kinds = "deployments,services,configmaps,poddisruptionbudgets,horizontalpodautoscalers"
    items = json.loads(cluster.kubectl("get", kinds, "-o", "json", namespace=namespace).stdout)["items"]
    out = []
    for obj in items:
        if not any(ref.get("name") == owner for ref in obj["metadata"].get("ownerReferences", [])):
            continue
        meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_FIELDS and k != "namespace"}
        meta.get("annotations", {}).pop("deployment.kubernetes.io/revision", None)
        spec = dict(obj.get("spec", {}))
        for key in ("clusterIP", "clusterIPs"):
            spec.pop(key, None)
        out.append({k: v for k, v in {**obj, "metadata": meta, "spec": spec}.items() if k != "status"})
    if not any(o["kind"] == "Deployment" for o in out):
        raise RuntimeError(f"no Deployment of {namespace}/{owner} to copy for the fair floor")
    return out


def renamed(docs: list[dict], old: str, new: str) -> list[dict]:
    """The documents with the ChatbotService's name replaced wherever it stands as a whole name part."""
    text = re.sub(rf"\b{re.escape(old)}\b(?![0-9])", new, json.dumps(docs))
    return json.loads(text)


def fair_floor(cluster: Cluster, template: Template, n: int, tmp: Path, timeout: float) -> dict:
    """The operator's own manifests for n ChatbotServices, created directly with no operator (and no
    ChatbotService): seconds until all their Deployments are available, CPU, API requests."""
    ns = f"fair-{n}"
    cluster.kubectl("create", "namespace", ns)
    docs = [d for i in range(n) for d in renamed(template.objects, "bot-0", f"fair-{i}")]
    return {
        "chatbotservices": n,
        "namespace": ns,
        "objects_per_cbs": len(template.objects),
        "kinds": sorted(d["kind"] for d in template.objects),
        "deployment_bytes": len(json.dumps(next(d for d in template.objects if d["kind"] == "Deployment"))),
        **deployments_to_available(cluster, ns, docs, n, tmp, timeout),
    }


def custom_resource_floor(cluster: Cluster, template: Template, n: int, tmp: Path, timeout: float) -> dict:
    """The fair floor with the custom resources: each ChatbotService POSTed and its status written when its
    Deployment is available (Ready), beside the operator's objects for it, all by the benchmark's client
    with no operator: what any operator of a ChatbotService costs the cluster at least (one status write
    per ChatbotService, as the operator's for pods Ready within its first-status hold; no watches, no
    decisions)."""
    ns = f"crfloor-{n}"
    cluster.kubectl("create", "namespace", ns)
    docs = [
        d for i in range(n) for d in [chatbot(f"fair-{i}"), *renamed(template.objects, "bot-0", f"fair-{i}")]
    ]
    writer = StatusWriter(cluster, ns, template.status)
    try:
        row = deployments_to_available(cluster, ns, docs, n, tmp, timeout, writer)
        return {"chatbotservices": n, "namespace": ns, **row}
    finally:
        writer.close()


class StatusWriter:
    """The custom-resource floor's status writes: JSON merge patches of a ChatbotService's status, the
    operator's kind of write, from the benchmark's client."""

    def __init__(self, cluster: Cluster, namespace: str, ready_status: dict) -> None:
        self.api, self.namespace = client(cluster), namespace
        self.ready_status = ready_status
        self.pool = ThreadPoolExecutor(16)
        self.pending: list = []

    def _patch(self, name: str, status: dict) -> None:
        path = f"/apis/chatfleet.io/v1alpha1/namespaces/{self.namespace}/chatbotservices/{name}/status"
        body = {"status": renamed([status], "bot-0", name)[0]}
        send(self.api, "PATCH", path, body, "application/merge-patch+json")

    def available(self, deployment: dict) -> None:
        """A Deployment seen available: its ChatbotService's Ready status, in the writer's threads."""
        name = deployment["metadata"]["labels"]["chatfleet.io/service"]
        self.pending.append(self.pool.submit(self._patch, name, self.ready_status))

    def wait(self) -> None:
        """Until every Ready status is written (raises the first failure)."""
        for future in self.pending:
            future.result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Template:
    """What the operator made of one ChatbotService ("bot-0"): its objects (fair_manifests) and the
    ChatbotService's status once Ready."""

    objects: list[dict]
    status: dict


def operator_template(cluster: Cluster, tmp: Path, timeout: float) -> Template:
    """Run the operator on one ChatbotService ("bot-0", as the fleets name it) until Ready; its objects
    and status; the operator stopped and the namespace deleted again."""
    op = Operator(cluster, tmp)
    try:
        cluster.kubectl("create", "namespace", "template")
        create_all(cluster, "template", [chatbot("bot-0")], tmp)
        if wait_all_ready(cluster, "template", "chatbotservices", 1, time.monotonic(), timeout) is None:
            raise RuntimeError("the template ChatbotService never turned Ready")
        objects = fair_manifests(cluster, "template", "bot-0")
        cbs = cluster.kubectl("get", "chatbotservices", "bot-0", "-o", "json", namespace="template").stdout
    finally:
        op.stop()
    delete_namespace(cluster, "template")
    return Template(objects, json.loads(cbs)["status"])


def ratios(floors: list[dict], fleets: list[dict], cr_floors: list[dict] | None = None) -> dict:
    """One round's ratios per size, of time to all Ready and of the machine's CPU: the operator over the
    fair floor ("time", "machine_cpu"); with the custom-resource floor's rows, also the operator over it
    and it over the fair floor (what the custom resources cost, and what the operator adds to them)."""
    pairs = (("time", "all_ready_s"), ("machine_cpu", "machine_cpu_seconds_to_ready"))

    def over(a: dict, b: dict, suffix: str = "") -> dict:
        return {
            what + suffix: round(a[key] / b[key], 3) if a.get(key) and b.get(key) else None
            for what, key in pairs
        }

    out = {}
    for i, (floor, fleet) in enumerate(zip(floors, fleets, strict=True)):
        row = over(fleet, floor) | {
            "operator_s": fleet.get("all_ready_s"),
            "floor_s": floor.get("all_ready_s"),
        }
        if cr_floors:
            cr = cr_floors[i]
            row |= over(fleet, cr, "_over_cr_floor") | over(cr, floor, "_cr_floor_over_floor")
            row["cr_floor_s"] = cr.get("all_ready_s")
        out[str(fleet["chatbotservices"])] = row
    return out


#: Every ratio a round can have (those over the custom-resource floor only with its rows).
RATIOS_WITH_CR_FLOOR = tuple(
    what + suffix
    for suffix in ("", "_over_cr_floor", "_cr_floor_over_floor")
    for what in ("time", "machine_cpu")
)


def median_ratios(rounds: list[dict]) -> dict:
    """The median of each ratio over the rounds, per size."""
    out: dict = {}
    for size in rounds[0]:
        out[size] = {}
        for what in (w for w in RATIOS_WITH_CR_FLOOR if w in rounds[0][size]):
            values = [r[size][what] for r in rounds if r.get(size, {}).get(what) is not None]
            out[size][what] = round(statistics.median(values), 3) if values else None
    return out


def floors_of(args: argparse.Namespace) -> list[tuple[str, str, Callable]]:
    """The floors the run compares the operator with: (result key, name, row function); the fair floor, and
    the custom-resource floor with --custom-resource-floor."""
    floors = [("fair_floor", "fair floor", fair_floor)]
    if args.custom_resource_floor:
        floors.append(("custom_resource_floor", "custom-resource floor", custom_resource_floor))
    return floors


def floor_rows(
    cluster: Cluster,
    row: Callable,
    name: str,
    template: Template,
    sizes: list[int],
    tmp: Path,
    timeout: float,
    delete: bool,
) -> list[dict]:
    """One floor's rows, one per size, on `cluster`; with `delete`, each row's namespace deleted after it
    (the next row starts on an API server without its objects)."""
    rows = []
    for n in sizes:
        log(f"{name}: {n} ChatbotServices, no operator")
        rows.append(row(cluster, template, n, tmp, timeout))
        if delete:
            delete_namespace(cluster, rows[-1]["namespace"])
    return rows


def another_round(
    args: argparse.Namespace, sizes: list[int], template: Template, directory: Path
) -> tuple[Cluster, dict[str, list[dict]], list[dict]]:
    """Each floor's rows on a new cluster, then the operator's on another: (the operator's cluster, the
    floors' rows by result key, the fleets)."""
    floors = {}
    for key, name, row in floors_of(args):
        cluster = start_cluster(directory / key, args.nodes, args.node_lease_seconds)
        try:
            label = f"{directory.name}: {name}"
            floors[key] = floor_rows(cluster, row, label, template, sizes, directory, args.timeout, False)
        finally:
            cluster.down()
    cluster = start_cluster(directory / "operator", args.nodes, args.node_lease_seconds)
    op = Operator(cluster, directory)
    try:
        fleets = []
        for n in sizes:
            log(f"{directory.name}: fleet of {n} ChatbotServices")
            fleets.append(run_fleet(cluster, op, n, directory, args.steady, args.timeout))
    finally:
        op.stop()
    return cluster, floors, fleets


def start_cluster(directory: Path, nodes: int, lease_seconds: int = NODE_LEASE_SECONDS) -> Cluster:
    """The local platform with `nodes` kwok GPU nodes and the ChatbotService CRD."""
    cluster = Cluster(directory, progress=log)
    cluster.up(nodes=nodes, timeout=max(300, nodes * 0.5), node_lease_seconds=lease_seconds)
    cluster.install_crd(CHATBOT_CRD_FILE, CHATBOT_CRD_NAME)
    settle_nodes(cluster, nodes)
    return cluster


def node_writes(cluster: Cluster) -> int:
    """The API server's writes of nodes and their status so far (not their leases)."""
    counts = api_requests(cluster)
    return sum(
        v
        for k, v in counts.items()
        if k.split(" ")[0] in ("PATCH", "PUT") and k.split(" ")[-1] in ("nodes", "nodes/status")
    )


def settle_nodes(cluster: Cluster, nodes: int, window_s: float = 10, limit_s: float = 240) -> None:
    """Wait until a new cluster's nodes are no longer being written (kwok's first status, the node
    controller's taints: about two writes per node in the first minute), so that no row pays for its
    cluster's start: fewer than one write per hundred nodes in `window_s`, or `limit_s` at most."""
    t0, last = time.monotonic(), node_writes(cluster)
    while time.monotonic() - t0 < limit_s:
        time.sleep(window_s)
        now = node_writes(cluster)
        if now - last < max(1, nodes // 100):
            log(f"nodes settled: {now} node writes, {time.monotonic() - t0:.0f}s")
            return
        last = now
    log(f"nodes still written after {limit_s:.0f}s ({last} node writes); going on")


def delete_namespace(cluster: Cluster, ns: str) -> None:
    """Delete a namespace and wait (the next row starts on an API server without its objects)."""
    cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s", check=False, timeout=320)


def write_profile_comparisons(sizes: list[int]) -> list[str]:
    """For each size, each pair of rows profiled (the operator's and the fair floor's; with the
    custom-resource floor, each of them and it): what the first row's API server spent more than the
    second's, by function, cumulative and flat, then each row alone (bench-results/apiserver-profile-<size>.txt);
    the files written."""
    written = []
    for n in sizes:
        rows = {
            label: PROFILED_ROWS[key]
            for label, key in (
                ("the operator's row", f"operator-{n}"),
                ("the custom-resource floor's row", f"crfloor-{n}"),
                ("the fair floor's row", f"fair-{n}"),
            )
            if key in PROFILED_ROWS
        }
        if len(rows) < 2:
            continue
        labels = list(rows)
        text = ""
        for i, first in enumerate(labels):
            for second in labels[i + 1 :]:
                text += f"# The API server's CPU for {n} ChatbotServices: {first}, more than {second}\n"
                text += top(rows[first], base=rows[second], cumulative=True) + "\n"
                text += "# The same, by flat time\n" + top(rows[first], base=rows[second]) + "\n"
        for label, profile in rows.items():
            text += f"# {label} alone, by cumulative time\n" + top(profile, cumulative=True) + "\n"
        path = RESULTS / f"apiserver-profile-{n}.txt"
        path.write_text(text)
        written.append(str(path.relative_to(REPO)))
    return written


def platform_figure() -> dict | None:
    """The platform benchmark's own bare figure, if it has run."""
    path = RESULTS / "platform.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def table(result: dict) -> str:
    """Human-readable summary."""
    rows = [("figure", *[f"{r['chatbotservices']} CBS" for r in result["fleets"]])]
    fleets = result["fleets"]

    def row(name: str, key: str, unit: str = "") -> None:
        rows.append((name, *[f"{r[key]}{unit}" if r[key] is not None else "timeout" for r in fleets]))

    row("all Ready (s)", "all_ready_s")
    row("  of which creating them (s)", "client_create_s")
    row("writes per CBS at creation", "writes_per_cbs_at_creation")
    row("writes per minute, steady", "steady_writes_per_min")
    row("reconcile passes", "passes")
    for stage, label in (
        ("created_to_deployment", "created -> Deployment"),
        ("deployment_to_ready", "Deployment -> Ready"),
    ):
        rows.append(
            (
                f"{label} p50 / p90 / max (s)",
                *[" / ".join(f"{v:.0f}" for v in r["stage_seconds"][stage].values()) for r in fleets],
            )
        )
    for comp in COMPONENTS:
        rows.append(
            (f"CPU s to all Ready: {comp}", *[str(r["cpu_seconds_to_ready"].get(comp, 0.0)) for r in fleets])
        )
    row("  of which its garbage collector", "operator_gc_seconds_at_creation")
    row("operator RSS (MiB)", "operator_rss_mib")
    rounds = result.get("rounds") or []
    first_round = rounds[0] if rounds else {}

    def ratio_rows(ratios_and_labels: tuple[tuple[str, str], ...]) -> None:
        """Rows of the first round's ratios (`ratios`: the figures the JSON keeps), one per (ratio, label)."""
        for what, label in ratios_and_labels:
            values = [first_round.get(str(r["chatbotservices"]), {}).get(what) for r in fleets]
            rows.append((label, *[f"{v:.2f}x" if v else "-" for v in values]))

    lat = result["latency"]
    rows.append(("reconcile pass p50 / p99 (ms)", f"{lat['p50_ms']} / {lat['p99_ms']}", ""))
    base = result.get("baseline")
    if base:
        rows.append(
            (f"no operator: {base['deployments']} Deployments available (s)", str(base["all_ready_s"]), "")
        )
        cpu = base["cpu_seconds_to_ready"]
        rows.append(("  its CPU s (all components)", str(round(sum(cpu.values()), 1)), ""))
    base = result.get("baseline_with_services")
    if base:
        rows.append(
            (
                f"no operator: {base['deployments']} Deployments + Services, available (s)",
                str(base["all_ready_s"]),
                "",
            )
        )
        cpu = base["cpu_seconds_to_ready"]
        rows.append(("  its CPU s (all components)", str(round(sum(cpu.values()), 1)), ""))
    fair = {f["chatbotservices"]: f for f in result.get("fair_floor", [])}
    if fair:
        row("machine CPU s to all Ready", "machine_cpu_seconds_to_ready")
        floors = [fair.get(r["chatbotservices"], {}) for r in fleets]
        rows.append(
            (
                "fair floor (operator's objects, no operator) all available (s)",
                *[str(f.get("all_ready_s")) for f in floors],
            )
        )
        rows.append(("  its machine CPU s", *[str(f.get("machine_cpu_seconds_to_ready")) for f in floors]))
        ratio_rows(
            (
                ("time", "operator / fair floor, time to all Ready"),
                ("machine_cpu", "operator / fair floor, machine CPU s"),
            )
        )
    crs = {f["chatbotservices"]: f for f in result.get("custom_resource_floor", [])}
    if crs:
        crf = [crs.get(r["chatbotservices"], {}) for r in fleets]
        rows.append(
            ("custom-resource floor (no operator) all Ready (s)", *[str(c.get("all_ready_s")) for c in crf])
        )
        rows.append(("  its machine CPU s", *[str(c.get("machine_cpu_seconds_to_ready")) for c in crf]))
        for what, label in (("time", "time to all Ready"), ("machine_cpu", "machine CPU s")):
            ratio_rows(
                (
                    (f"{what}_over_cr_floor", f"operator / custom-resource floor, {label}"),
                    (f"{what}_cr_floor_over_floor", f"custom-resource / fair floor, {label}"),
                )
            )
    if len(rounds) > 1:
        for size, median in result["median_ratios"].items():
            for what, label in (
                ("time", "operator / floor, time"),
                ("machine_cpu", "  machine CPU s"),
                ("time_over_cr_floor", "operator / custom-resource floor, time"),
                ("time_cr_floor_over_floor", "custom-resource / fair floor, time"),
            ):
                if what not in median:
                    continue
                each = ", ".join(f"{r[size][what]:.2f}x" for r in rounds if r[size].get(what))
                median_text = f"{median[what]:.2f}x" if median[what] else "-"
                rows.append(
                    (f"{size} CBS, {len(rounds)} rounds: {label}", f"{each}; median {median_text}", "")
                )
    rst = result.get("restart")
    if rst:
        kinds = ", ".join(f"{k} {v}" for k, v in rst["writes_by_kind"].items() if v) or "none"
        rows.append(
            (
                f"restart over {rst['chatbotservices']} Ready CBS: writes (goal 0)",
                f"{rst['writes']} ({kinds})",
                "",
            )
        )
        rows.append(
            (
                "  its passes / seconds to pass over all",
                f"{rst['passes']} / {rst['seconds_to_pass_over_all']}",
                "",
            )
        )
    rows.append(
        (
            "host load average at start / end",
            f"{result['load_average_at_start']:.1f} / {result['load_average_at_end']:.1f}",
            "",
        )
    )
    width = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, width, strict=False)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="200,1000", help="fleet sizes, comma-separated")
    ap.add_argument("--nodes", type=int, default=250, help="simulated GPU nodes (7 GPUs each on average)")
    ap.add_argument(
        "--node-lease-seconds",
        type=int,
        default=NODE_LEASE_SECONDS,
        help="the simulated nodes' lease and the node controller's grace (longer for thousands of nodes, "
        "whose renewals fall behind on a saturated machine)",
    )
    ap.add_argument("--steady", type=float, default=60, help="seconds of steady state to count writes over")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for a fleet to be Ready")
    ap.add_argument("--no-baseline", action="store_true", help="skip the no-operator baseline")
    ap.add_argument(
        "--no-bare", action="store_true", help="skip the bare Deployment rows (keep the fair floor)"
    )
    ap.add_argument(
        "--fresh-cluster",
        action="store_true",
        help="a new cluster (new etcd) for the operator's rows instead of deleting the floors' namespaces "
        "(for fleets of 10,000, whose deletion takes longer than their creation)",
    )
    ap.add_argument(
        "--profile", action="store_true", help="sample the operator with py-spy during the fleets"
    )
    ap.add_argument(
        "--apiserver-profile",
        action="store_true",
        help="profile the API server's CPU over each floor's and fleet's row (its /debug/pprof) and "
        "compare them by function: bench-results/apiserver-profile-<size>.txt",
    )
    ap.add_argument(
        "--custom-resource-floor",
        action="store_true",
        help="also the custom-resource floor: the fair floor with each ChatbotService POSTed and its status "
        "written once, when its Deployment is available, by the benchmark's client (no operator), each row "
        "on its own new cluster",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="the fair floor and the operator's rows this many times, alternately, each on a new cluster; "
        "the ratios of every round and their median (the machine's speed drifts between rows)",
    )
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    fresh = args.fresh_cluster or args.rounds > 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the cluster on SIGTERM
    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chatfleet-opbench-") as tmpdir:
        tmp = Path(tmpdir)
        if args.apiserver_profile:
            global APISERVER_PROFILES
            APISERVER_PROFILES = RESULTS / "apiserver-profiles"
            os.environ["CHATFLEET_APISERVER_PROFILING"] = "1"
        cluster = start_cluster(tmp / "cluster", args.nodes, args.node_lease_seconds)
        try:
            result: dict = {
                "cpus": os.cpu_count(),
                "load_average_at_start": os.getloadavg()[0],
                "nodes": args.nodes,
                "node_lease_seconds": args.node_lease_seconds,
                "fleets": [],
            }
            if not (args.no_baseline or args.no_bare):
                for services, key in ((False, "baseline"), (True, "baseline_with_services")):
                    what = "Deployments and Services" if services else "Deployments"
                    log(f"baseline: {max(sizes)} {what} without the operator")
                    result[key] = baseline(cluster, max(sizes), tmp, args.timeout, services=services)
                    delete_namespace(cluster, f"baseline-{max(sizes)}{'-svc' if services else ''}")
            if not args.no_baseline:
                log("fair floor: the operator's objects for one ChatbotService, to create again without it")
                template = operator_template(cluster, tmp, args.timeout)
                for i, (key, name, row) in enumerate(floors_of(args)):
                    if fresh and i > 0:
                        cluster.down()
                        cluster = start_cluster(tmp / f"cluster-{key}", args.nodes, args.node_lease_seconds)
                    result[key] = floor_rows(
                        cluster, row, name, template, sizes, tmp, args.timeout, not fresh
                    )
                if fresh:
                    log("a new cluster for the operator's rows")
                    cluster.down()
                    cluster = start_cluster(tmp / "cluster-operator", args.nodes, args.node_lease_seconds)
                    result["fresh_cluster_for_operator"] = True
            op = Operator(cluster, tmp)
            profile_file = RESULTS / "operator-profile.txt"
            profiler = start_profiler(op.proc.pid, profile_file) if args.profile else None
            try:
                for n in sizes:
                    log(f"fleet of {n} ChatbotServices")
                    result["fleets"].append(run_fleet(cluster, op, n, tmp, args.steady, args.timeout))
                final = op.stats()
            finally:
                if profiler is not None:
                    result["profile"] = stop_profiler(profiler, profile_file)
                op.stop()
            if not args.no_baseline:
                cr_floors = result.get("custom_resource_floor")
                result["rounds"] = [ratios(result["fair_floor"], result["fleets"], cr_floors)]
                for number in range(2, args.rounds + 1):
                    cluster.down()
                    cluster, floors, fleets = another_round(args, sizes, template, tmp / f"round-{number}")
                    result["rounds"].append(
                        ratios(floors["fair_floor"], fleets, floors.get("custom_resource_floor"))
                    )
                result["median_ratios"] = median_ratios(result["rounds"])
            fleet = sum(r["chatbotservices"] for r in result["fleets"])
            log(f"restart: a new operator over the {fleet} Ready ChatbotServices")
            result["restart"] = restart(cluster, tmp, fleet, args.steady, args.timeout)
            result["latency"] = {
                "p50_ms": round(final["latency_p50_s"] * 1000, 1),
                "p99_ms": round(final["latency_p99_s"] * 1000, 1),
            }
            result["operator_max_rss_mib"] = round(final["max_rss_mib"], 1)
            result["platform"] = platform_figure()
            result["load_average_at_end"] = os.getloadavg()[0]
            result["apiserver_profiles"] = write_profile_comparisons(sizes)
        finally:
            cluster.down()
    (RESULTS / "operator.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwritten: {RESULTS / 'operator.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
