"""`make demo`, step 5: a bad canary caught by analysis and rolled back, then a good one promoted, live.

Called by demo.py once `support-bot` is Ready in `default` and the operator runs. kwok pods serve no
traffic, so a trafficsim exporter plays the pods' metrics (same names as the runtime) and a real
Prometheus scrapes it; the operator queries that Prometheus exactly as it would in production.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from . import services
from .config import PlatformError
from .trafficsim import TrafficSim

NS, NAME = "default", "support-bot"
IMAGE = "ghcr.io/chatfleet/chatfleet-runtime"
STEPS = [
    {"weight": 20, "pauseSeconds": 5},
    {"weight": 50, "pauseSeconds": 5},
    {"weight": 100, "pauseSeconds": 0},
]


def _status(demo: Any) -> dict[str, Any]:
    """status of support-bot."""
    res = demo.cluster.kubectl("get", "chatbotservice", NAME, "-n", NS, "-o", "json", check=False)
    return (json.loads(res.stdout).get("status") or {}) if res.returncode == 0 else {}


def _patch(demo: Any, spec: dict[str, Any]) -> None:
    """Merge-patch the spec (what a GitOps commit would do)."""
    demo.cluster.kubectl(
        "patch", "chatbotservice", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec})
    )


def _line(st: dict[str, Any]) -> str:
    """One progress line from status."""
    rel = st.get("release") or {}
    a = rel.get("analysis") or {}
    figures = ", ".join(
        f"{f['metric']} {f['canary']:.3g}{f.get('unit', '')}" if "canary" in f else f"{f['metric']} n/a"
        for f in a.get("figures") or []
    )
    text = f"{rel.get('phase', 'no release')}: weight {st.get('canaryWeight', 0)}%"
    if a.get("checks"):
        text += f"; analysis {a.get('lastVerdict')} ({a.get('failed', 0)} failed of {a.get('checks')})"
    if figures:
        text += f" [{figures}]"
    return text


def _follow(demo: Any, done, timeout: float) -> dict[str, Any]:
    """Print each change of the release until done(status); the last status."""
    last = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = _status(demo)
        line = _line(st)
        if line != last:
            demo.say(line, dim=True)
            last = line
        if done(st):
            return st
        time.sleep(0.5)
    raise PlatformError(
        f"the release did not finish within {timeout:.0f}s: {json.dumps(_status(demo))[-1500:]}"
    )


def _plugin(demo: Any, *args: str) -> None:
    """Show `kubectl chatbot ARGS`."""
    print(f"    $ kubectl chatbot {' '.join(args)} -n {NS}", flush=True)
    res = subprocess.run(
        [sys.executable, "-m", "chatfleet_operator.plugin", *args, "-n", NS],
        env=demo.cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    demo.show(res.stdout or res.stderr)


def run_release_demo(demo: Any) -> None:
    """A bad canary rolled back, then a good one promoted (about a minute and a half)."""
    workdir = demo.cluster.workdir / "release-demo"
    sim = TrafficSim(NS, NAME).start()
    sim.healthy(30)
    prom = services.Prometheus(workdir / "prometheus", targets=[sim.target]).start()
    try:
        demo.say(f"trafficsim exporting {NAME}'s metrics at {sim.target}; Prometheus at {prom.url}", ok=True)
        _patch(
            demo,
            {
                "rollout": {"strategy": "canary", "canary": {"steps": STEPS}},
                "analysis": {
                    "prometheusAddress": prom.url,
                    "intervalSeconds": 5,
                    "failureLimit": 2,
                    "thresholds": {"errorRatePercent": 1, "latencyP99Milliseconds": 2000},
                },
            },
        )
        demo.say(
            "release plan: 20% -> 50% -> 100%, analysis every 5 s, error rate <= 1%, P99 <= 2 s, failureLimit 2"
        )
        time.sleep(3)  # let Prometheus collect a few samples of the stable track

        # 1. A bad release: the new image fails 15% of the requests.
        demo.say(
            f"releasing {IMAGE}:0.2.0-rc1, which fails 15% of requests (set on the trafficsim)", bad=True
        )
        sim.set("canary", error_rate=0.15)
        _patch(demo, {"runtime": {"image": f"{IMAGE}:0.2.0-rc1"}})
        st = _follow(demo, lambda s: (s.get("release") or {}).get("phase") == "RolledBack", 120)
        demo.say(f"rolled back: {st.get('abortReason', '')}", bad=True)
        demo.kubectl_show("get", "chatbotservice", NAME, "-n", NS)
        demo.kubectl_show(
            "get", "events", "-n", NS, "--field-selector", "reason=RolledBack", "-o",
            "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
        )  # fmt: skip
        _plugin(demo, "status", NAME)

        # 2. A good release: the fixed image.
        demo.say(f"releasing the fixed {IMAGE}:0.2.0 (healthy canary)", ok=True)
        sim.set("canary", error_rate=0.002)
        _patch(demo, {"runtime": {"image": f"{IMAGE}:0.2.0"}})
        target = None

        def promoted(s: dict[str, Any]) -> bool:
            """The good release finished: stable runs its revision."""
            nonlocal target
            target = target or (s.get("release") or {}).get("revision")
            return bool(target) and s.get("stableRevision") == target and not s.get("release")

        st = _follow(demo, promoted, 150)
        demo.say(f"promoted revision {st.get('stableRevision')} through 20% -> 50% -> 100%", ok=True)
        _plugin(demo, "history", NAME)
        demo.kubectl_show("get", "chatbotservice", NAME, "-n", NS, "-o", "wide")
    finally:
        prom.stop()
        sim.stop()
