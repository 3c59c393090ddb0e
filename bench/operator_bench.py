"""Benchmark the operator on the local platform; prints a table and writes bench-results/operator.json.

Figures: time for 200 and for 1,000 ChatbotServices applied at once to all be Ready (goal: 1,000 in
<= 60 s on 2 cores); reconcile pass latency p50/p99; API write requests per ChatbotService at creation
(goal <= 4) and per minute at steady state (goal: 0); operator memory; where the time went (CPU seconds
of each platform process and of the operator, and the API server's requests by verb and resource, from
the creation to all Ready). Side by side, in the same run, with no operator running: the same number of
single-GPU Deployments becoming available, and of Deployments plus a Service each (what the operator
creates).

Writes are counted two ways and added: the operator's own counter (every apply, delete, status patch,
event; read through SIGUSR1 -> --stats-file) plus kopf's bookkeeping patches on ChatbotServices (from
the API server's apiserver_request_total, non-status PATCHes of chatbotservices).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kubernetes
from chatfleet_platform.cluster import Cluster
from chatfleet_platform.config import CHATBOT_CRD_FILE, CHATBOT_CRD_NAME
from percentiles import operator_figures

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench-results"


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


def create_all(cluster: Cluster, namespace: str, docs: list[dict], tmp: Path) -> float:
    """POST every document at once from 16 client threads (like a GitOps sync); seconds the client took."""
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.configuration.connection_pool_maxsize = 16

    def create(doc: dict) -> None:
        group_version = doc["apiVersion"]
        prefix = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        plural = {"ChatbotService": "chatbotservices", "Deployment": "deployments", "Service": "services"}[
            doc["kind"]
        ]
        _, url, headers, body, _ = api.param_serialize(
            "POST",
            f"{prefix}/namespaces/{namespace}/{plural}",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=doc,
            auth_settings=["BearerToken"],
        )
        response = api.call_api("POST", url, header_params=headers, body=body, _request_timeout=60)
        response.read()
        if response.status >= 300:
            raise RuntimeError(f"create {doc['metadata']['name']}: {response.status} {response.data[:300]!r}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, docs))
    return time.monotonic() - t0


def count_ready(cluster: Cluster, namespace: str, kind: str) -> int:
    """How many objects of the kind are ready (ChatbotService Ready=True, Deployment available)."""
    if kind == "chatbotservices":
        path = '{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}'
        out = cluster.kubectl("get", kind, "-o", f"jsonpath={path}", namespace=namespace, check=False).stdout
        return sum(1 for line in out.splitlines() if line.strip() == "True")
    path = '{range .items[*]}{.status.availableReplicas}{"\\n"}{end}'
    out = cluster.kubectl("get", kind, "-o", f"jsonpath={path}", namespace=namespace, check=False).stdout
    return sum(1 for line in out.splitlines() if line.strip() == "1")


def wait_all_ready(
    cluster: Cluster, namespace: str, kind: str, n: int, t0: float, timeout: float
) -> float | None:
    """Seconds from t0 until all n are ready (polled every 2 s); None on timeout."""
    last = -1
    while time.monotonic() - t0 < timeout:
        ready = count_ready(cluster, namespace, kind)
        if ready != last:
            log(f"{namespace}: {ready}/{n} ready after {time.monotonic() - t0:.1f}s")
            last = ready
        if ready >= n:
            return time.monotonic() - t0
        time.sleep(2.0)
    return None


def api_requests(cluster: Cluster) -> dict[str, int]:
    """The API server's request counts by "VERB resource[/subresource]" (apiserver_request_total)."""
    counts: dict[str, int] = {}
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1)
            for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
            if "=" in part
        )
        verb, resource = labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"')
        sub = labels.get("subresource", "").strip('"')
        if verb in ("WATCH", "CONNECT") or not resource:
            continue
        key = f"{verb} {resource}{'/' + sub if sub else ''}"
        counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
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
    r0, c0 = api_requests(cluster), cpu_seconds(str(tmp))
    t0 = time.monotonic()
    apply_s = create_all(cluster, ns, [chatbot(f"bot-{i}") for i in range(n)], tmp)
    ready_s = wait_all_ready(cluster, ns, "chatbotservices", n, t0, timeout)
    r1, c1 = api_requests(cluster), cpu_seconds(str(tmp))
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
        "passes": s2["passes"] - s0["passes"],
        # where the time went, from the creation to all Ready: CPU seconds per process, API requests
        "cpu_seconds_to_ready": delta(c1, c0),
        "api_requests_to_ready": delta(r1, r0, top=15),
        "stage_seconds": stages,
    }


def baseline(cluster: Cluster, n: int, tmp: Path, timeout: float, services: bool = False) -> dict:
    """n single-GPU Deployments (and, with `services`, a Service each), no operator: seconds until all
    Deployments are available."""
    ns = f"baseline-{n}{'-svc' if services else ''}"
    cluster.kubectl("create", "namespace", ns)
    r0, c0 = api_requests(cluster), cpu_seconds(str(tmp))
    t0 = time.monotonic()
    docs = [bare_deployment(f"bare-{i}") for i in range(n)]
    if services:  # interleaved, as a GitOps sync of n (Deployment, Service) pairs would send them
        docs = [d for i, dep in enumerate(docs) for d in (dep, bare_service(f"bare-{i}"))]
    apply_s = create_all(cluster, ns, docs, tmp)
    ready_s = wait_all_ready(cluster, ns, "deployments", n, t0, timeout)
    r1, c1 = api_requests(cluster), cpu_seconds(str(tmp))
    return {
        "deployments": n,
        "services": n if services else 0,
        "client_create_s": round(apply_s, 1),
        "all_ready_s": round(ready_s, 1) if ready_s else None,
        "cpu_seconds_to_ready": delta(c1, c0),
        "api_requests_to_ready": delta(r1, r0, top=15),
    }


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
    row("operator RSS (MiB)", "operator_rss_mib")
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
    ap.add_argument("--steady", type=float, default=60, help="seconds of steady state to count writes over")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for a fleet to be Ready")
    ap.add_argument("--no-baseline", action="store_true", help="skip the no-operator baseline")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the cluster on SIGTERM
    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chatfleet-opbench-") as tmpdir:
        tmp = Path(tmpdir)
        cluster = Cluster(tmp / "cluster", progress=log)
        try:
            cluster.up(nodes=args.nodes, timeout=300)
            cluster.install_crd(CHATBOT_CRD_FILE, CHATBOT_CRD_NAME)
            result: dict = {
                "cpus": os.cpu_count(),
                "load_average_at_start": os.getloadavg()[0],
                "nodes": args.nodes,
                "fleets": [],
            }
            if not args.no_baseline:
                for services, key in ((False, "baseline"), (True, "baseline_with_services")):
                    what = "Deployments and Services" if services else "Deployments"
                    log(f"baseline: {max(sizes)} {what} without the operator")
                    result[key] = baseline(cluster, max(sizes), tmp, args.timeout, services=services)
                    cluster.kubectl(
                        "delete",
                        "namespace",
                        f"baseline-{max(sizes)}{'-svc' if services else ''}",
                        "--wait=true",
                        "--timeout=300s",
                        check=False,
                        timeout=320,
                    )
            op = Operator(cluster, tmp)
            try:
                for n in sizes:
                    log(f"fleet of {n} ChatbotServices")
                    result["fleets"].append(run_fleet(cluster, op, n, tmp, args.steady, args.timeout))
                final = op.stats()
            finally:
                op.stop()
            result["latency"] = {
                "p50_ms": round(final["latency_p50_s"] * 1000, 1),
                "p99_ms": round(final["latency_p99_s"] * 1000, 1),
            }
            result["operator_max_rss_mib"] = round(final["max_rss_mib"], 1)
            result["platform"] = platform_figure()
            result["load_average_at_end"] = os.getloadavg()[0]
        finally:
            cluster.down()
    (RESULTS / "operator.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwritten: {RESULTS / 'operator.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
