"""One release with real Triton servers as stable and canary (the runtime's tritonserver + chat API).

Test design: kwok pods carry the release's Kubernetes side; the traffic and the metrics are real. Two
local runtimes (tiny model, tritonserver, chat API, Redis) play the stable and the canary pods; a real
Prometheus scrapes both chat APIs' /metrics and adds the `namespace` and `track` labels, exactly what
the pod scrape config does in a cluster (docs/releases.md). A load thread chats with both.
  tick 0: release of revision v2 starts; canary measurements come from the real canary runtime;
  tick k: a measurement passes on real figures (error rate, P99 latency, TTFT);
  tick k+1: the canary's tritonserver is killed: its chat API answers with errors/fallbacks;
  tick k+2..: error rate over 1% in 2 checks -> rollback, with the real figures in status.
"""

from __future__ import annotations

import os
import threading

import pytest
from release_e2e import bot_spec, rolled_back

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.triton, pytest.mark.slow]


@pytest.fixture
def runtimes(tmp_path, e2e_namespace):
    """Stable and canary runtimes whose chat APIs label their series with model=bot."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from chatfleet_platform.localruntime.testing import local_runtime

    env = {"CHATFLEET_MODEL_NAME": "bot", "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "5"}
    with (
        local_runtime(tmp_path / "stable", api_env=env) as stable,
        local_runtime(tmp_path / "canary", api_env=env) as canary,
    ):
        yield stable, canary


def test_real_triton_canary_turning_bad_rolls_back(
    release_operator, e2e_namespace, cluster, make_prometheus, runtimes
):
    from chatfleet_platform.localruntime.testing import post_json
    from release_e2e import Release

    stable_rt, canary_rt = runtimes
    scrape = [
        {
            "job_name": track,
            "metrics_path": "/metrics",
            "static_configs": [
                {
                    "targets": [rt.api.metrics_url.split("//", 1)[1].removesuffix("/metrics")],
                    "labels": {"namespace": e2e_namespace, "track": track},
                }
            ],
        }
        for track, rt in (("stable", stable_rt), ("canary", canary_rt))
    ]
    prom = make_prometheus(scrape_configs=scrape)
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            for rt in (stable_rt, canary_rt):
                try:
                    post_json(
                        f"{rt.api_url}/v1/chat/completions",
                        {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4},
                        timeout=10,
                    )
                except OSError:
                    pass
            i += 1
            stop.wait(0.2)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    bot = Release(cluster, e2e_namespace, "bot")
    try:
        spec = bot_spec(
            prom.url,
            analysis={
                "thresholds": {
                    "errorRatePercent": 1,
                    "latencyP99Milliseconds": 20000,
                    "timeToFirstTokenP99Milliseconds": 20000,
                }
            },
            rollout={"strategy": "canary", "canary": {"steps": [{"weight": 50, "pauseSeconds": 600}]}},
        )
        bot.apply(spec)
        # 120 s: on a 2-core machine this test shares the CPUs with two tritonservers, Prometheus and the load
        bot.wait(lambda r: r.cond("Ready").get("status") == "True", 120, "Ready")
        bot.patch({"model": {"revision": "v2"}})
        # a measurement passes on the real runtimes' figures
        bot.wait(
            lambda r: (r.release().get("analysis") or {}).get("successful", 0) >= 1,
            120,
            "a passing measurement",
        )
        figures = {f["metric"]: f for f in bot.release()["analysis"]["figures"]}
        assert "canary" in figures["P99 latency"] and "stable" in figures["P99 latency"]
        # the canary's Triton dies: its chat API now fails or falls back
        canary_rt.triton.stop()
        bot.wait(rolled_back, 120, "rollback of the real canary")
        assert "error rate" in bot.status()["abortReason"]
    finally:
        stop.set()
        loader.join(timeout=15)
