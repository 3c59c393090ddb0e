"""`make bench-rollout`: how fast a bad canary is rolled back, how long a healthy canary takes, false rollbacks.

Everything real but the pods' containers: the local Kubernetes (kwok GPU nodes), the operator as a
subprocess, a real Prometheus scraping the trafficsim exporter (the runtime's metric names, per-track
error rate and latency set by this script).

1. Rollback time, analysis interval 10 s, failureLimit 2: a canary holding at 20% turns bad (20% errors);
   time until all traffic is back on stable (status RolledBack and the canary Deployment at 0 replicas).
   Side by side with the documented rules of Flagger (interval x threshold) and Argo Rollouts
   (interval x (failureLimit + 1)) for the same settings; goal <= 2 intervals + 5 s.
2. Total time of a healthy 5-step canary against its theoretical minimum (the sum of the step pauses).
3. False rollbacks over 20 healthy releases (short intervals), goal 0.

Writes bench-results/rollout.json and prints a table. Environment: ROLLBACK_RUNS (3), HEALTHY_RELEASES (20).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

from chatfleet_platform import services  # noqa: E402
from chatfleet_platform.cluster import Cluster  # noqa: E402
from chatfleet_platform.config import LOCAL_ANALYSIS_ARGS  # noqa: E402
from chatfleet_platform.trafficsim import TrafficSim  # noqa: E402

NS = "default"
INTERVAL, FAILURE_LIMIT = 10, 2
ROLLBACK_RUNS = int(os.environ.get("ROLLBACK_RUNS", "3"))
HEALTHY_RELEASES = int(os.environ.get("HEALTHY_RELEASES", "20"))


def say(msg: str) -> None:
    """Progress line."""
    print(f"[bench-rollout] {msg}", flush=True)


class Bench:
    """The platform, the operator, one trafficsim + Prometheus per ChatbotService."""

    def __init__(self) -> None:
        self.cluster = Cluster(REPO / ".work" / "bench-rollout", progress=lambda m: None)
        self.sims: list[TrafficSim] = []
        self.proms: list[services.Prometheus] = []

    def up(self) -> None:
        """Cluster, CRD, operator."""
        say("starting the local platform")
        self.cluster.up(nodes=4)
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        self.cluster.kubectl(
            "wait", "--for=condition=Established", "crd/chatbotservices.chatfleet.io", "--timeout=60s"
        )
        self.cluster.start_extra(
            "operator", [sys.executable, "-m", "chatfleet_operator.cli", "run", *LOCAL_ANALYSIS_ARGS]
        )
        time.sleep(3)

    def down(self) -> None:
        """Stop everything started here."""
        for s in self.sims:
            s.stop()
        for p in self.proms:
            p.stop()
        self.cluster.down()

    def metrics_for(self, name: str) -> tuple[TrafficSim, services.Prometheus]:
        """A trafficsim for `name` and a Prometheus scraping it every second."""
        sim = TrafficSim(NS, name).start()
        sim.healthy(20)
        prom = services.Prometheus(self.cluster.workdir / f"prom-{name}", targets=[sim.target]).start()
        self.sims.append(sim)
        self.proms.append(prom)
        return sim, prom

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        """kubectl get ... -o json (empty dict on error)."""
        res = self.cluster.kubectl(*args, "-o", "json", namespace=NS, check=False)
        return json.loads(res.stdout) if res.returncode == 0 else {}

    def status(self, name: str) -> dict[str, Any]:
        """status of a ChatbotService."""
        return self.kubectl_json("get", "chatbotservice", name).get("status") or {}

    def apply(self, name: str, spec: dict[str, Any]) -> None:
        """Create/update a ChatbotService."""
        doc = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), namespace=NS)

    def wait(self, pred, timeout: float, what: str, interval: float = 0.2) -> float:
        """Wait for pred(); the monotonic time it held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return time.monotonic()
            time.sleep(interval)
        raise RuntimeError(f"{what} did not happen within {timeout}s")


def spec(
    prom: str, revision: str, steps: list[dict[str, Any]], interval: int, replicas: int = 2
) -> dict[str, Any]:
    """A ChatbotService spec for the bench."""
    return {
        "model": {"uri": "hf://org/tiny", "revision": revision},
        "resources": {
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "gpusPerReplica": 1,
            "cpu": "1",
            "memory": "4Gi",
        },
        "scaling": {"replicas": replicas},
        "rollout": {"strategy": "canary", "canary": {"steps": steps}},
        "analysis": {
            "prometheusAddress": prom,
            "intervalSeconds": interval,
            "failureLimit": FAILURE_LIMIT,
            "consecutiveErrorLimit": 4,
            "progressDeadlineSeconds": 120,
        },
    }


def ready(b: Bench, name: str) -> bool:
    """Ready=True with no release."""
    st = b.status(name)
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or []
    ) and not st.get("release")


def rollback_time(b: Bench, run: int) -> float:
    """Seconds from the canary turning bad to all traffic back on stable."""
    name = f"rb-{run}"
    sim, prom = b.metrics_for(name)
    b.apply(name, spec(prom.url, "v1", [{"weight": 20, "pauseSeconds": 3600}], INTERVAL))
    b.wait(lambda: ready(b, name), 90, f"{name} Ready")
    b.apply(name, spec(prom.url, "v2", [{"weight": 20, "pauseSeconds": 3600}], INTERVAL))
    # the canary serves healthily and has passed at least one measurement ...
    b.wait(
        lambda: ((b.status(name).get("release") or {}).get("analysis") or {}).get("successful", 0) >= 1,
        120,
        "a passing measurement",
    )
    time.sleep(INTERVAL * (run % 3) / 3)  # spread the bad moment over the interval
    # ... then turns bad
    sim.set("canary", error_rate=0.2)
    t0 = time.monotonic()

    def back_on_stable() -> bool:
        """Rolled back and the canary Deployment at zero."""
        st = b.status(name)
        rel = st.get("release") or {}
        dep = b.kubectl_json("get", "deployment", f"{name}-canary")
        return rel.get("phase") == "RolledBack" and (dep.get("spec") or {}).get("replicas") == 0

    t1 = b.wait(back_on_stable, 120, "rollback")
    return t1 - t0


def healthy_canary(b: Bench, name: str, steps: list[dict[str, Any]], interval: int) -> tuple[float, bool]:
    """Seconds from the spec change to promotion; whether it promoted (False: rolled back)."""
    prom = b.proms[-1]
    current = b.kubectl_json("get", "chatbotservice", name)["spec"]["model"]["revision"]
    nxt = f"r{int(current[1:]) + 1}" if current.startswith("r") else "r1"
    before = b.status(name).get("stableRevision")
    t0 = time.monotonic()
    b.apply(name, spec(prom.url, nxt, steps, interval))

    def done() -> str:
        """'promoted', 'rolled back', or '' while the release runs."""
        st = b.status(name)
        if (st.get("release") or {}).get("phase") == "RolledBack":
            return "rolled back"
        if st.get("stableRevision") not in (None, before) and not st.get("release"):
            return "promoted"
        return ""

    end = b.wait(done, 600, "release end", interval=0.2)
    return end - t0, done() == "promoted"


def main() -> int:
    """Run the three measurements; print the table; write bench-results/rollout.json."""
    b = Bench()
    results: dict[str, Any] = {"interval_seconds": INTERVAL, "failure_limit": FAILURE_LIMIT}
    try:
        b.up()
        # 1. rollback time
        times = []
        for run in range(ROLLBACK_RUNS):
            t = rollback_time(b, run)
            say(f"rollback run {run + 1}: {t:.1f}s from bad canary to all traffic on stable")
            times.append(t)
        flagger = INTERVAL * FAILURE_LIMIT  # Flagger: interval x threshold
        argo = INTERVAL * (FAILURE_LIMIT + 1)  # Argo Rollouts: interval x (failureLimit + 1)
        goal = 2 * INTERVAL + 5
        results["rollback"] = {
            "runs_seconds": [round(t, 1) for t in times],
            "mean_seconds": round(sum(times) / len(times), 1),
            "max_seconds": round(max(times), 1),
            "goal_seconds": goal,
            "flagger_rule_seconds": flagger,
            "argo_rollouts_rule_seconds": argo,
        }
        # 2. healthy 5-step canary vs its theoretical minimum
        five = [{"weight": w, "pauseSeconds": 10} for w in (10, 20, 40, 60, 100)]
        _, prom = b.metrics_for("five")
        b.apply("five", spec(prom.url, "r0", five, 5))
        b.wait(lambda: ready(b, "five"), 90, "five Ready")
        total, ok = healthy_canary(b, "five", five, 5)
        minimum = sum(s["pauseSeconds"] for s in five)
        results["five_step"] = {
            "seconds": round(total, 1),
            "theoretical_minimum_seconds": minimum,
            "promoted": ok,
        }
        say(f"5-step healthy canary: {total:.1f}s (minimum {minimum}s), promoted={ok}")
        # 3. false rollbacks over N healthy releases (short intervals)
        short = [{"weight": 50, "pauseSeconds": 2}, {"weight": 100, "pauseSeconds": 0}]
        _, prom = b.metrics_for("healthy")
        b.apply("healthy", spec(prom.url, "r0", short, 2))
        b.wait(lambda: ready(b, "healthy"), 90, "healthy Ready")
        outcomes, durations = [], []
        for i in range(HEALTHY_RELEASES):
            t, ok = healthy_canary(b, "healthy", short, 2)
            outcomes.append(ok)
            durations.append(t)
            say(
                f"healthy release {i + 1}/{HEALTHY_RELEASES}: {'promoted' if ok else 'ROLLED BACK'} in {t:.1f}s"
            )
        results["false_rollbacks"] = {
            "releases": HEALTHY_RELEASES,
            "false_rollbacks": outcomes.count(False),
            "goal": 0,
            "mean_release_seconds": round(sum(durations) / len(durations), 1),
        }
    finally:
        b.down()
    out = REPO / "bench-results" / "rollout.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    return 0


def print_table(r: dict[str, Any]) -> None:
    """The side-by-side table."""
    rb = r["rollback"]
    rows = [
        (
            "Rollback: bad canary -> all traffic on stable",
            "Chatfleet (measured)",
            f"{rb['mean_seconds']}s mean, {rb['max_seconds']}s max",
            "",
        ),
        (
            "  same settings (interval 10 s, limit 2)",
            "Flagger rule: interval x threshold",
            f"{rb['flagger_rule_seconds']}s",
            f"{rb['mean_seconds'] / rb['flagger_rule_seconds']:.2f}x",
        ),
        (
            "",
            "Argo Rollouts rule: interval x (failureLimit+1)",
            f"{rb['argo_rollouts_rule_seconds']}s",
            f"{rb['mean_seconds'] / rb['argo_rollouts_rule_seconds']:.2f}x",
        ),
        (
            "",
            "goal: 2 intervals + 5 s",
            f"{rb['goal_seconds']}s",
            "met" if rb["max_seconds"] <= rb["goal_seconds"] else "MISSED",
        ),
    ]
    f = r["five_step"]
    rows.append(
        (
            "Healthy 5-step canary, total",
            "measured vs sum of pauses",
            f"{f['seconds']}s vs {f['theoretical_minimum_seconds']}s",
            f"{f['seconds'] / f['theoretical_minimum_seconds']:.2f}x",
        )
    )
    fr = r["false_rollbacks"]
    rows.append(
        (
            "False rollbacks, healthy releases",
            f"{fr['releases']} releases",
            f"{fr['false_rollbacks']}",
            "goal 0",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as e:
        print(f"bench failed: {e}", file=sys.stderr)
        sys.exit(1)
