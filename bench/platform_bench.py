"""Benchmark the local platform: the floor the operator's own scale figures are compared to.

Figures:

- Cold build time: a real cold build into a scratch cache with empty Go caches (with --cold), otherwise
  the time recorded when the cache was built.
- Warm start to ready (goal <= 20 s on 2 cores).
- Memory of the whole platform at rest.
- Time for 1,000 GPU pods to be Running and Ready across 250 simulated nodes.
- Real nodes: the node's start (images imported included); the image builds, cold (as recorded when the
  cache was built), warm and after a one-line change (recorded by `python -m chatfleet_platform.cluster.images
  build --label`); a runtime pod from created to Ready; and a chat's latency through the Service
  (kube-proxy) against the same chat straight to the pod, side by side in one run.

Prints a table and writes bench-results/platform.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chatfleet_platform.cluster.cluster import Cluster
from chatfleet_platform.common.config import (
    BUILD_SCRIPT,
    CHATBOT_CRD_FILE,
    CHATBOT_CRD_NAME,
    REPO_ROOT,
    binaries,
    cache_dir,
    read_versions,
)

RESULTS = REPO_ROOT / "bench-results"


def cold_build() -> dict:
    """Build every binary into a scratch cache with empty GOCACHE and GOMODCACHE; seconds."""
    with tempfile.TemporaryDirectory(prefix="chatfleet-cold-") as tmp:
        env = {
            **os.environ,
            "CHATFLEET_CACHE": f"{tmp}/cache",
            "GOCACHE": f"{tmp}/gocache",
            "GOMODCACHE": f"{tmp}/gomod",
        }
        t0 = time.monotonic()
        subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, check=True, capture_output=True)
        total = time.monotonic() - t0
        subprocess.run(["chmod", "-R", "u+w", tmp], check=False)  # Go's module cache is read-only
        per = {p.parent.name: int(p.read_text()) for p in Path(f"{tmp}/cache/bin").glob("*/build-seconds")}
    return {"total_s": round(total, 1), "components_s": per, "measured": "now, scratch caches"}


def recorded_build() -> dict:
    """Cold build times recorded when the cache was built (None where not recorded)."""
    per = {p.parent.name: int(p.read_text()) for p in (cache_dir() / "bin").glob("*/build-seconds")}
    return {"total_s": sum(per.values()) or None, "components_s": per, "measured": "when cached"}


def warm_starts(runs: int) -> list[float]:
    """Seconds from nothing running to ready (4 GPU nodes), binaries cached."""
    out = []
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix=f"chatfleet-warm{i}-") as tmp:
            c = Cluster(Path(tmp) / "c")
            t0 = time.monotonic()
            try:
                c.up(nodes=4)
                out.append(time.monotonic() - t0)
            finally:
                c.down()
    return out


def memory_at_rest(settle_s: float) -> dict:
    """RSS (MiB) per component after the cluster has idled for settle_s."""
    with tempfile.TemporaryDirectory(prefix="chatfleet-mem-") as tmp:
        c = Cluster(Path(tmp) / "c")
        try:
            c.up(nodes=4)
            time.sleep(settle_s)
            return {k: round(v, 1) for k, v in c.memory_rss_mib().items()}
        finally:
            c.down()


def gpu_pods_at_scale(pods: int, nodes: int) -> dict:
    """Seconds for `pods` single-GPU pods (10 Deployments) to be Running+Ready on `nodes` nodes."""
    with tempfile.TemporaryDirectory(prefix="chatfleet-scale-") as tmp:
        c = Cluster(Path(tmp) / "c")
        try:
            t_up = c.up(nodes=nodes, timeout=300)
            per = pods // 10
            deps = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": f"gpu-{i}", "namespace": "default"},
                    "spec": {
                        "replicas": per,
                        "selector": {"matchLabels": {"app": f"gpu-{i}"}},
                        "template": {
                            "metadata": {"labels": {"app": f"gpu-{i}"}},
                            "spec": {
                                "containers": [
                                    {
                                        "name": "triton",
                                        "image": "chatfleet/runtime:bench",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                    }
                                ]
                            },
                        },
                    },
                }
                for i in range(10)
            ]
            t0 = time.monotonic()
            c.apply(deps)
            ready = 0
            deadline = t0 + 600
            while time.monotonic() < deadline:
                out = json.loads(c.kubectl("get", "deployments", "-n", "default", "-o", "json").stdout)
                ready = sum(d.get("status", {}).get("readyReplicas", 0) for d in out["items"])
                if ready >= per * 10:
                    break
                time.sleep(0.5)
            elapsed = time.monotonic() - t0
            rss = c.memory_rss_mib()
            return {
                "pods": per * 10,
                "nodes": nodes,
                "ready": ready,
                "seconds_to_all_ready": round(elapsed, 1),
                "pods_per_second": round(ready / elapsed, 1),
                "cluster_up_s": round(t_up, 1),
                "rss_mib_at_end": round(sum(rss.values()), 1),
            }
        finally:
            c.down()


def real_node_figures(chats: int) -> dict:
    """A real node's start, a runtime pod created -> Ready, chat p50 through the Service vs to the pod."""
    from chatfleet_platform.cluster import images
    from chatfleet_platform.load.realpods import chat_once, on_real_node, service_url
    from chatfleet_platform.localruntime.tiny import build_tiny_model

    builder = images.ImageBuilder()
    t0 = time.monotonic()
    refs = builder.build(list(images.ALL_NAMES))
    warm_build = time.monotonic() - t0
    recorded = json.loads((images.images_dir() / "build-times.json").read_text()).get("measured", {})
    model = build_tiny_model(REPO_ROOT / ".work" / "realnode-model")
    with tempfile.TemporaryDirectory(prefix="chatfleet-real-") as tmp:
        c = Cluster(Path(tmp) / "c")
        try:
            c.up(nodes=4)
            t0 = time.monotonic()
            c.add_real_nodes(1, gpus=4)
            node_up = time.monotonic() - t0
            c.install_crd(CHATBOT_CRD_FILE, CHATBOT_CRD_NAME)
            c.start_extra(
                "operator", [sys.executable, "-m", "chatfleet_operator.cli", "run"]
            )  # down() stops it
            spec = on_real_node({}, image=refs["runtime"]["ref"], model_dir=model)
            doc = {
                "apiVersion": "chatfleet.io/v1alpha1",
                "kind": "ChatbotService",
                "metadata": {"name": "bench"},
            }
            c.kubectl("apply", "-n", "default", "-f", "-", input=json.dumps({**doc, "spec": spec}))
            c.kubectl(
                "wait", "-n", "default", "--for=condition=Ready", "cbs/bench", "--timeout=600s", timeout=620
            )
            pod = json.loads(
                c.kubectl(
                    "get", "pods", "-n", "default", "-l", "chatfleet.io/service=bench", "-o", "json"
                ).stdout
            )["items"][0]
            ready_at = next(
                x["lastTransitionTime"] for x in pod["status"]["conditions"] if x["type"] == "Ready"
            )
            pod_ready_s = _ts(ready_at) - _ts(pod["metadata"]["creationTimestamp"])
            via_service, direct = service_url(c, "default", "bench"), f"http://{pod['status']['podIP']}:8080"
            lat: dict[str, list[float]] = {"service": [], "pod": []}
            for _ in range(chats):  # side by side, A B A B, so drift hits both alike
                for name, url in (("service", via_service), ("pod", direct)):
                    t1 = time.monotonic()
                    assert chat_once(url, stream=False) == "ok"
                    lat[name].append(time.monotonic() - t1)
        finally:
            c.down()
    p50 = {k: statistics.median(v) * 1000 for k, v in lat.items()}
    return {
        "node_up_s": round(node_up, 1),
        "image_builds_recorded": {k: v.get("seconds") for k, v in sorted(recorded.items())},
        "image_build_warm_now_s": round(warm_build, 1),
        "runtime_pod_created_to_ready_s": round(pod_ready_s, 1),
        "chat_p50_ms": {k: round(v, 1) for k, v in p50.items()},
        "chat_service_over_pod": round(p50["service"] / p50["pod"], 3),
        "chats": chats,
    }


def _ts(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp (second precision, as the API writes them)."""
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> None:
    """Run the benchmark and print its table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cold", action="store_true", help="measure a real cold build (several minutes)")
    ap.add_argument("--runs", type=int, default=3, help="warm start runs")
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--chats", type=int, default=30, help="chats per path for the Service vs pod latency")
    ap.add_argument("--no-real-node", action="store_true", help="skip the real-node rows")
    args = ap.parse_args()
    missing = binaries().missing()
    if missing:
        raise SystemExit(f"binaries missing ({', '.join(missing)}): run `make platform-build` first")

    build = cold_build() if args.cold else recorded_build()
    warm = warm_starts(args.runs)
    mem = memory_at_rest(settle_s=20)
    scale = gpu_pods_at_scale(args.pods, args.nodes)
    real = None if args.no_real_node else real_node_figures(args.chats)
    result = {
        "versions": read_versions(),
        "cpus": os.cpu_count(),
        "cold_build": build,
        "warm_start_s": [round(x, 2) for x in warm],
        "warm_start_median_s": round(statistics.median(warm), 2),
        "memory_at_rest_mib": mem,
        "memory_at_rest_total_mib": round(sum(mem.values()), 1),
        "scale": scale,
        "real_node": real,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "platform.json").write_text(json.dumps(result, indent=2))

    goal = 20.0
    rows = [
        (
            "cold build, all binaries",
            f"{build['total_s']} s" if build["total_s"] else "not recorded",
            f"({build['measured']}) "
            + ", ".join(f"{k} {v}s" for k, v in sorted(build["components_s"].items())),
        ),
        (
            "warm start to ready (median)",
            f"{result['warm_start_median_s']} s",
            f"goal <= {goal:.0f} s: {result['warm_start_median_s'] / goal:.2f}x of goal; runs {result['warm_start_s']}",
        ),
        (
            "memory at rest (RSS)",
            f"{result['memory_at_rest_total_mib']} MiB",
            ", ".join(f"{k} {v}" for k, v in mem.items()),
        ),
        (
            f"{scale['pods']} GPU pods Ready on {scale['nodes']} nodes",
            f"{scale['seconds_to_all_ready']} s",
            f"{scale['pods_per_second']} pods/s; {scale['ready']} ready",
        ),
    ]
    if real:
        builds = real["image_builds_recorded"]
        rows += [
            ("real node up (images imported)", f"{real['node_up_s']} s", "kubelet + containerd + kube-proxy"),
            (
                "image builds (recorded)",
                f"{builds.get('runtime_cold', '-')} s",
                "runtime cold; " + ", ".join(f"{k} {v}s" for k, v in builds.items()),
            ),
            ("image build, nothing changed (now)", f"{real['image_build_warm_now_s']} s", "all images"),
            (
                "runtime pod created -> Ready (real)",
                f"{real['runtime_pod_created_to_ready_s']} s",
                "tiny model, CPU",
            ),
            (
                "chat p50: Service / straight to pod",
                f"{real['chat_service_over_pod']}x",
                f"{real['chat_p50_ms']['service']} ms vs {real['chat_p50_ms']['pod']} ms, {real['chats']} each, A B A B",
            ),
        ]
    print(f"\nbench-platform (Kubernetes {result['versions']['K8S_VERSION']}, {result['cpus']} CPUs)")
    print(f"{'figure':40} {'value':>12}  notes")
    for name, value, note in rows:
        print(f"{name:40} {value:>12}  {note}")
    print(f"\nwrote {RESULTS / 'platform.json'}")


if __name__ == "__main__":
    main()
