"""Releases on real pods: real traffic through the Service, metrics scraped from the pods themselves.

Test design: the bot runs one stable replica of the tiny model on the real node. A client chats through
the Service's ClusterIP, plain and streamed by turns; kube-proxy spreads the requests over the pods. Every
request carries a system message, as chat front-ends send. Prometheus finds the pods through the API and
labels the series from the pods' own labels (the chart's PodMonitor rules). The analysis thus sees only
what the pods really served.

- Bad canary: the new revision's chat template refuses the system role. It passes warm-up (no system
  message), turns Ready, and then fails every real request. It must be rolled back on its error rate.
  Afterwards the traffic must be off the canary: the Service's endpoints hold only stable pods, and the
  client sees only successes.
- Healthy release: promoted while users chat, in test_realnode_zero_drop.py (every turn asserted there;
  the test here that only counted answers during a promotion was folded into it, one bot less).
- Dying runtime: the canary's Triton process is killed from the host. Its container restarts, and the
  health check rolls the release back without waiting for metrics.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from chatfleet_platform.common.config import REPO_ROOT
from chatfleet_platform.load.realpods import (
    NO_SYSTEM_TEMPLATE,
    ChatLoad,
    kill_container_process,
    on_real_node,
    pod_request_counts,
    service_url,
)
from chatfleet_platform.load.releasetraffic import Bot, rolled_back

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

RESULTS = REPO_ROOT / ".work" / "realnode-results.json"


def bot_spec(prometheus: str) -> dict[str, Any]:
    """One stable replica; a canary of one pod beside it (replica ratio: no Gateway API here)."""
    return {
        "model": {"hostPath": "/", "maxContextTokens": 512},
        "runtime": {"maxNewTokens": 8, "streaming": True},
        "scaling": {"replicas": 1},
        "rollout": {
            "strategy": "canary",
            "canary": {"steps": [{"weight": 50, "pauseSeconds": 20}, {"weight": 100, "pauseSeconds": 0}]},
        },
        "analysis": {
            "prometheusAddress": prometheus,
            "intervalSeconds": 5,
            "failureLimit": 1,
            "consecutiveErrorLimit": 4,
            "progressDeadlineSeconds": 240,
            "thresholds": {"errorRatePercent": 5, "latencyP99Milliseconds": 20000},
        },
    }


def record(key: str, value: Any) -> None:
    """Keep a figure of these runs in .work/realnode-results.json (the closing notes quote them)."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[key] = value
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True))


def apply_stable(bot: Bot, pod_prometheus, runtime_image, host_model_dir) -> None:
    """Create the bot: one stable replica on the real node."""
    bot.apply(on_real_node(bot_spec(pod_prometheus.url), image=runtime_image, model_dir=host_model_dir))


@pytest.fixture(scope="module", autouse=True)
def _second_bot_ahead(head_start, cluster, real_operator, pod_prometheus, runtime_image, host_model_dir):
    """The health-check test's bot, applied as the module starts (conftest's HeadStart)."""
    head_start.begin(lambda ns: apply_stable(Bot(cluster, ns), pod_prometheus, runtime_image, host_model_dir))


def started_stable(
    bot: Bot, pod_prometheus, runtime_image, host_model_dir, *, applied: bool = False
) -> tuple[ChatLoad, str]:
    """Create the bot (unless `applied` ahead), wait until it is Ready and its pod's metrics reach
    Prometheus; start the client."""
    if not applied:
        apply_stable(bot, pod_prometheus, runtime_image, host_model_dir)
    bot.wait(lambda: bot.cond("Ready").get("status") == "True", 600, "stable Ready")
    url = service_url(bot.cluster, bot.ns, bot.name)
    load = ChatLoad(url, workers=2, max_seconds=900).start()
    bot.wait(
        lambda: pod_request_counts(pod_prometheus.url, bot.ns, bot.name), 120, "pod metrics in Prometheus"
    )
    return load, url


def test_bad_canary_on_real_traffic_is_rolled_back(
    cluster, real_operator, real_ns, pod_prometheus, runtime_image, host_model_dir
):
    bot = Bot(cluster, real_ns)
    load, _ = started_stable(bot, pod_prometheus, runtime_image, host_model_dir)
    try:
        t_bad = time.monotonic()
        bot.patch({"model": {"chatTemplate": NO_SYSTEM_TEMPLATE}})
        bot.wait(lambda: bot.pods("canary"), 120, "a canary pod")
        bot.wait(lambda: rolled_back(bot), 420, "rollback of the bad canary")
        t_rb = time.monotonic()
        counts = pod_request_counts(pod_prometheus.url, bot.ns, bot.name)
        canary_served = sum(v for (pod, track), v in counts.items() if track == "canary")
        assert canary_served > 0, f"the canary never took real traffic: {counts}"
        assert "error rate" in bot.cond("Stalled").get("message", ""), bot.cond("Stalled")
        # the traffic left the canary: only stable pods behind the Service, only successes from then on
        bot.wait(lambda: not bot.pods("canary"), 120, "canary pods gone")
        t_gone = time.monotonic()
        stable = {p["metadata"]["name"] for p in bot.pods("stable")}
        assert bot.endpoint_pods() <= stable
        # users arrive spaced out (the client addresses are reused only after the affinity TTL), so a
        # fixed sleep can see no request at all: wait for a few finished ones instead
        bot.wait(lambda: sum(load.since(t_gone).values()) >= 3, 120, "requests after the canary left")
        after = load.since(t_gone)
        assert after and set(after) == {"ok"}, (
            f"requests after the canary left: {after}\n"
            + "\n".join(load.failures_since(t_gone))
            + "\n"
            + bot.snapshot()
        )
        record(
            "bad_canary",
            {
                "seconds_to_rollback": round(t_rb - t_bad, 1),
                "per_pod_requests": {f"{p}/{t}": v for (p, t), v in counts.items()},
            },
        )
    finally:
        load.stop()


def test_dying_runtime_container_drives_the_health_rollback(
    cluster, real_operator, ahead_ns, pod_prometheus, runtime_image, host_model_dir
):
    bot = Bot(cluster, ahead_ns)
    load, _ = started_stable(bot, pod_prometheus, runtime_image, host_model_dir, applied=True)
    try:
        bot.patch({"runtime": {"maxNewTokens": 7}})

        def ready_canary() -> dict[str, Any] | None:
            for p in bot.pods("canary"):
                statuses = p.get("status", {}).get("containerStatuses") or []
                if statuses and all(s.get("ready") for s in statuses):
                    return p
            return None

        pod = bot.wait(ready_canary, 420, "a Ready canary pod")
        kill_container_process(cluster, pod, "triton")
        bot.wait(lambda: rolled_back(bot), 300, "health-check rollback")
        message = bot.cond("Stalled").get("message", "")
        assert "restart" in message.lower() or "crash" in message.lower(), message
    finally:
        load.stop()
