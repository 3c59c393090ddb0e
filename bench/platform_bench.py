"""Benchmark the local platform: the floor the operator's own scale figures are compared to.

Figures: cold build time (a real cold build into a scratch cache with empty Go caches, with --cold;
otherwise the time recorded when the cache was built), warm start-to-ready (goal <= 20 s on 2 cores),
memory of the whole platform at rest, and time for 1,000 GPU pods to be Running and Ready across 250
simulated nodes. Prints a table and writes bench-results/platform.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from chatfleet_platform.cluster import Cluster
from chatfleet_platform.config import BUILD_SCRIPT, REPO_ROOT, binaries, cache_dir, read_versions

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


def main() -> None:
    """Run the benchmark and print its table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cold", action="store_true", help="measure a real cold build (several minutes)")
    ap.add_argument("--runs", type=int, default=3, help="warm start runs")
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=250)
    args = ap.parse_args()
    missing = binaries().missing()
    if missing:
        raise SystemExit(f"binaries missing ({', '.join(missing)}): run `make platform-build` first")

    build = cold_build() if args.cold else recorded_build()
    warm = warm_starts(args.runs)
    mem = memory_at_rest(settle_s=20)
    scale = gpu_pods_at_scale(args.pods, args.nodes)
    result = {
        "versions": read_versions(),
        "cpus": os.cpu_count(),
        "cold_build": build,
        "warm_start_s": [round(x, 2) for x in warm],
        "warm_start_median_s": round(statistics.median(warm), 2),
        "memory_at_rest_mib": mem,
        "memory_at_rest_total_mib": round(sum(mem.values()), 1),
        "scale": scale,
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
    print(f"\nbench-platform (Kubernetes {result['versions']['K8S_VERSION']}, {result['cpus']} CPUs)")
    print(f"{'figure':40} {'value':>12}  notes")
    for name, value, note in rows:
        print(f"{name:40} {value:>12}  {note}")
    print(f"\nwrote {RESULTS / 'platform.json'}")


if __name__ == "__main__":
    main()
