"""`make demo`, step 5: a bad canary caught by analysis and rolled back, then a good one promoted, live.

On real pods (the default, `run_real_release_demo`): the chatbot of step 4 runs on the real node. A client
chats through its Service. A real Prometheus discovers the pods through the Kubernetes API with the
chart's PodMonitor rules, and the operator judges the canary on what the pods really served. The bad
revision's chat template refuses the system role that every request carries, so it fails real requests.

Without real nodes (`REAL_NODES=0`, `run_release_demo`): kwok pods serve no traffic. A trafficsim
exporter plays the pods' metrics (same names as the runtime), and the operator queries a real Prometheus
that scrapes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from chatfleet_platform.common.config import PlatformError
from chatfleet_platform.load.trafficsim import TrafficSim
from chatfleet_platform.servers import services

NS, NAME = "default", "support-bot"
REAL_NS, REAL_NAME = "default", "chat-bot"
IMAGE = "ghcr.io/chatfleet/chatfleet-runtime"
STEPS = [
    {"weight": 20, "pauseSeconds": 5},
    {"weight": 50, "pauseSeconds": 5},
    {"weight": 100, "pauseSeconds": 0},
]


def _status(demo: Any, name: str = NAME, ns: str = NS) -> dict[str, Any]:
    """status of a ChatbotService (support-bot by default)."""
    res = demo.cluster.kubectl("get", "chatbotservice", name, "-n", ns, "-o", "json", check=False)
    return (json.loads(res.stdout).get("status") or {}) if res.returncode == 0 else {}


def _patch(demo: Any, spec: dict[str, Any], name: str = NAME, ns: str = NS) -> None:
    """Merge-patch the spec (what a GitOps commit would do)."""
    demo.cluster.kubectl(
        "patch", "chatbotservice", name, "-n", ns, "--type=merge", "-p", json.dumps({"spec": spec})
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


def _follow(demo: Any, done, timeout: float, name: str = NAME, ns: str = NS) -> dict[str, Any]:
    """Print each change of the release until done(status); the last status."""
    last = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = _status(demo, name, ns)
        line = _line(st)
        if line != last:
            demo.say(line, dim=True)
            last = line
        if done(st):
            return st
        time.sleep(0.5)
    raise PlatformError(
        f"the release did not finish within {timeout:.0f}s: {json.dumps(_status(demo, name, ns))[-1500:]}"
    )


def _plugin(demo: Any, *args: str, ns: str = NS) -> None:
    """Show `kubectl chatbot ARGS`."""
    print(f"    $ kubectl chatbot {' '.join(args)} -n {ns}", flush=True)
    res = subprocess.run(
        [sys.executable, "-m", "chatfleet_operator.plugin", *args, "-n", ns],
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
        st = _follow(demo, _promoted_to_new_revision(), 150)
        demo.say(f"promoted revision {st.get('stableRevision')} through 20% -> 50% -> 100%", ok=True)
        _plugin(demo, "history", NAME)
        demo.kubectl_show("get", "chatbotservice", NAME, "-n", NS, "-o", "wide")
    finally:
        prom.stop()
        sim.stop()


def _promoted_to_new_revision() -> Any:
    """Predicate: the release that started after this call finished and stable runs its revision.

    Right after a patch the status may still show the previous, rolled-back release: its revision is
    never the target.
    """
    target = None

    def promoted(s: dict[str, Any]) -> bool:
        nonlocal target
        rel = s.get("release") or {}
        if rel and rel.get("phase") != "RolledBack":
            target = rel.get("revision") or target
        return bool(target) and s.get("stableRevision") == target and not s.get("release")

    return promoted


def run_real_release_demo(demo: Any, prometheus: services.Prometheus) -> None:
    """On real pods: a bad canary rolled back on the errors it really served, then a good one promoted."""
    from chatfleet_platform.load.realpods import NO_SYSTEM_TEMPLATE, ChatLoad, pod_request_counts, service_url

    name, ns = REAL_NAME, REAL_NS
    load = ChatLoad(service_url(demo.cluster, ns, name), workers=2, max_seconds=900).start()
    try:
        demo.say(
            f"a client chats with {name} through its Service (plain and streamed, with a system message)"
        )
        _patch(
            demo,
            {
                "rollout": {"strategy": "canary", "canary": {"steps": STEPS}},
                "analysis": {
                    "prometheusAddress": prometheus.url,
                    "intervalSeconds": 5,
                    "failureLimit": 1,
                    "progressDeadlineSeconds": 300,
                    "thresholds": {"errorRatePercent": 5, "latencyP99Milliseconds": 20000},
                },
            },
            name,
            ns,
        )
        demo.say(
            f"Prometheus at {prometheus.url} finds the pods through the Kubernetes API (the chart's PodMonitor"
            " rules); release plan 20% -> 50% -> 100%, analysis every 5 s, error rate <= 5%"
        )
        deadline = time.monotonic() + 120
        while not pod_request_counts(prometheus.url, ns, name) and time.monotonic() < deadline:
            time.sleep(2)

        # 1. A bad release: a chat template that refuses the system role (warm-up passes, real requests fail)
        demo.say(
            "releasing a chat template that refuses the system role: a real defect of real pods", bad=True
        )
        _patch(demo, {"model": {"chatTemplate": NO_SYSTEM_TEMPLATE}}, name, ns)
        st = _follow(demo, lambda s: (s.get("release") or {}).get("phase") == "RolledBack", 420, name, ns)
        demo.say(f"rolled back: {st.get('abortReason', '')}", bad=True)
        counts = pod_request_counts(prometheus.url, ns, name)
        for (pod, track), value in sorted(counts.items()):
            demo.say(f"  {pod} ({track}) answered {value:.0f} requests", dim=True)
        _plugin(demo, "status", name, ns=ns)

        # 2. A good release: the template fixed (back to the model's own), a smaller answer budget
        demo.say("releasing the fix (the model's own template, maxNewTokens 24): a healthy canary", ok=True)
        _patch(demo, {"model": {"chatTemplate": None}, "runtime": {"maxNewTokens": 24}}, name, ns)
        st = _follow(demo, _promoted_to_new_revision(), 600, name, ns)
        demo.say(f"promoted revision {st.get('stableRevision')} through 20% -> 50% -> 100%", ok=True)
        _plugin(demo, "history", name, ns=ns)
    finally:
        outcomes = load.stop()
        demo.say(f"client outcomes through the whole demo: {dict(outcomes)}", dim=True)
