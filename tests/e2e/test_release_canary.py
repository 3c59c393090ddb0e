"""Canary releases end to end: real apiserver + kwok pods, real Prometheus scraping a trafficsim.

Test design: each scenario applies `bot` (2 replicas, steps 25% / 50% / 100% with 2 s pauses, analysis
every 2 s, failureLimit 2, deadline 15 s), waits for it Ready on revision v1, then changes the model
revision (a new revision) with the canary's behaviour set on the trafficsim or by a kwok label. The
comments narrate what the operator does tick by tick. Waits are bounded; nothing asserts on speed.
"""

from __future__ import annotations

import signal

import pytest
from release_e2e import Release, promoted_to, release, rolled_back, start

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]


def test_healthy_canary_promotes_through_every_step(bot, prometheus, traffic):
    stable = start(bot, prometheus)
    new = release(bot)
    # tick 1: the release starts at 25%: a canary Deployment with 1 pod beside 2 stable pods (replica ratio).
    seen_weights: set[int] = set()

    def progress(r: Release) -> bool:
        st = r.status()
        seen_weights.add(st.get("canaryWeight", 0))
        return st.get("stableRevision") == new and not st.get("release")

    # ticks 2..n: canary Ready -> pause 2 s -> a passing measurement -> 50% -> ... -> 100% -> promotion.
    bot.wait(progress, 150, "promotion")
    assert {25, 50, 100} <= seen_weights, seen_weights
    st = bot.status()
    assert st["releaseHistory"][0]["result"] == "Promoted" and st["releaseHistory"][0]["revision"] == new
    # promotion: stable Deployment on the new revision at full size, canary at zero, traffic all stable.
    dep = bot.deployment("bot")
    assert dep["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == new
    assert bot.deployment("bot-canary")["spec"]["replicas"] == 0
    assert stable != new
    # Ready once the stable Deployment, back at full size on the new revision, has its pods available (the
    # pass right after the promotion may say RollingOut: it read the Deployment before kwok's pods were)
    bot.wait(lambda r: r.cond("Ready").get("status") == "True", 60, "Ready after the promotion")
    assert bot.events("ReleasePromoted")
    # the plugin shows the history, and says to CI that the rollout is done (exit 0)
    assert "Promoted" in bot.plugin("history", "bot")
    assert f"rolled out: revision {new} is stable and Ready" in bot.plugin("status", "bot", "--timeout", "30")


def test_error_rate_regression_rolls_back(bot, prometheus, traffic):
    stable = start(bot, prometheus)
    traffic.set("canary", error_rate=0.2)  # 20% of canary requests fail from now on
    new = release(bot)
    # tick 1: 25% on the canary; tick k: first measurement with data: error rate ~20% > 1% -> failed 1;
    # tick k+1 (2 s later): failed 2 >= failureLimit 2 -> rollback: traffic to stable, canary to 0, Stalled.
    bot.wait(rolled_back, 90, "rollback")
    st = bot.status()
    assert (
        "error rate" in st["abortReason"] and "> 1%" in st["abortReason"] and "in 2 of" in st["abortReason"]
    )
    assert st["stableRevision"] == stable and st["canaryWeight"] == 0
    assert bot.deployment("bot-canary")["spec"]["replicas"] == 0
    assert bot.deployment("bot")["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == stable
    warnings = bot.events("RolledBack")
    assert warnings and warnings[0]["type"] == "Warning" and "error rate" in warnings[0]["message"]
    # the rolled-back revision is not retried while the spec stays on it
    assert bot.status()["release"]["revision"] == new and bot.status()["release"]["phase"] == "RolledBack"


def test_latency_regression_alone_rolls_back(bot, prometheus, traffic):
    start(bot, prometheus)
    traffic.set("canary", latency_ms=3000, error_rate=0.0)  # P99 ~3 s > 1 s, errors fine
    release(bot)
    bot.wait(rolled_back, 90, "rollback on latency")
    reason = bot.status()["abortReason"]
    assert "P99 latency" in reason and "error rate" not in reason


def test_canary_pods_never_ready_roll_back_at_the_deadline(bot, prometheus, traffic):
    start(bot, prometheus)
    # the new revision's pods carry the kwok label that keeps them un-Ready
    bot.patch({"podMetadata": {"labels": {"sim.chatfleet.io/health": "unready"}}})
    # ticks: canary pod Running but never Ready; no measurement is taken; after 15 s -> rollback
    bot.wait(rolled_back, 60, "deadline rollback")
    assert "progressDeadlineSeconds (15s)" in bot.status()["abortReason"]


def test_canary_crash_loop_after_ready_rolls_back(bot, prometheus, traffic):
    start(bot, prometheus)
    bot.patch({"podMetadata": {"labels": {"sim.chatfleet.io/health": "crashloop"}}})
    # the canary pod gets Ready, then after ~4-9 s CrashLoopBackOff with restarts -> rollback at once
    bot.wait(rolled_back, 60, "crash-loop rollback")
    assert "crash-looping" in bot.status()["abortReason"]


def test_no_traffic_pauses_instead_of_promoting(bot, prometheus, traffic):
    start(bot, prometheus)
    traffic.set("canary", rps=0)  # nobody talks to the canary
    release(bot)
    # measurements are Inconclusive: the release pauses on step 1, never passes, never rolls back
    bot.wait(
        lambda r: r.cond("Reconciling").get("reason") == "AnalysisInconclusive", 60, "inconclusive pause"
    )
    st = bot.status()
    assert st["currentStepIndex"] == 0 and st["release"]["phase"] == "Progressing"
    assert "no traffic" in bot.cond("Reconciling")["message"]
    # traffic arrives -> the release goes on and promotes
    traffic.set("canary", rps=20)
    bot.wait(promoted_to(st["release"]["revision"]), 150, "promotion after traffic returned")


def test_prometheus_down_pauses_then_resumes(bot, prometheus, traffic):
    start(bot, prometheus)
    new = release(bot)
    bot.wait(lambda r: (r.release().get("analysis") or {}).get("checks", 0) >= 1, 60, "first measurement")
    prometheus.stop()
    # measurements are Errors: consecutiveErrors 3 > consecutiveErrorLimit 2 -> paused with a condition
    bot.wait(lambda r: r.cond("Reconciling").get("reason") == "AnalysisError", 60, "analysis error pause")
    assert "did not answer" in bot.cond("Reconciling")["message"]
    assert bot.status()["release"]["phase"] == "Progressing"  # never a rollback, never a pass
    prometheus.start()  # same port
    bot.wait(promoted_to(new), 180, "promotion after Prometheus returned")


def test_operator_killed_mid_release_resumes(bot, prometheus, traffic, release_operator):
    start(bot, prometheus)
    new = release(bot)
    bot.wait(lambda r: r.status().get("currentStepIndex") == 1, 90, "step 2")
    # kill -9 the operator at step 2; all release state is in status
    release_operator.stop(signal.SIGKILL)
    release_operator.start()
    bot.wait(promoted_to(new), 150, "promotion after restart")
    history = bot.status()["releaseHistory"]
    assert [h["result"] for h in history if h["revision"] == new] == ["Promoted"]
    assert len(bot.events("ReleasePromoted")) == 1  # no double promotion


def test_no_traffic_with_probe_load_promotes(bot, prometheus, traffic):
    traffic.set("canary", rps=0)  # nobody talks to the canary ...
    probe = {
        "enabled": True,
        "requests": 10,
        "url": f"http://{traffic.target}/probe/{{track}}/v1/chat/completions",
    }
    start(bot, prometheus, analysis={"probe": probe})
    new = release(bot)
    # ... so after an Inconclusive measurement the operator sends 10 test prompts per interval to the
    # canary (here the trafficsim's probe endpoint counts them as canary requests); the next measurements
    # have data, pass, and the release promotes without any user traffic.
    bot.wait(promoted_to(new), 150, "promotion on probe traffic")
    assert bot.status()["releaseHistory"][0]["result"] == "Promoted"
