"""Canary releases end to end: real apiserver + kwok pods, real Prometheus scraping a trafficsim.

Test design: each scenario applies `bot` (2 replicas, steps 25% / 50% / 100% with 2 s pauses, analysis
every 2 s, failureLimit 2, deadline 15 s), waits for it Ready on revision v1, then changes the model
revision (a new revision) with the canary's behaviour set on the trafficsim or by a kwok label. The
comments narrate what the operator does tick by tick. Waits are bounded; nothing asserts on speed.
"""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime

import pytest
from chatfleet_operator.timefmt import since
from release_e2e import Release, bot_spec, promoted_to, rolled_back

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]


def start(bot: Release, prometheus, **over) -> str:
    """Create the bot on revision v1, wait for Ready; its stable revision."""
    bot.apply(bot_spec(prometheus.url, **over))
    bot.wait(lambda r: r.cond("Ready").get("status") == "True", 60, "bot Ready on v1")
    return bot.status()["stableRevision"]


def release(bot: Release, **model) -> str:
    """Change the model revision (a GitOps commit); the new updateRevision."""
    before = bot.status().get("updateRevision")
    bot.patch({"model": {"revision": "v2", **model}})
    return bot.wait(
        lambda r: r.status().get("updateRevision") not in (None, before) and r.status()["updateRevision"],
        30,
        "new revision seen",
    )


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


def test_manual_abort_from_the_plugin(bot, prometheus, traffic):
    start(bot, prometheus)
    new = release(bot)
    bot.wait(lambda r: r.release().get("revision") == new, 30, "release started")
    out = bot.plugin("abort", "bot")
    assert new in out
    bot.wait(rolled_back, 30, "abort")
    assert "aborted by spec.rollout.abort" in bot.status()["abortReason"]
    # CI waiting on the rollout hears that it failed (exit 1), at once
    out = bot.plugin("status", "bot", "--timeout", "30", expect=1)
    assert f"failed: revision {new} was rolled back" in out


def test_a_release_rolled_back_by_hand_is_retried_from_the_plugin_promoted_and_undone(
    bot, prometheus, traffic
):
    first = start(bot, prometheus)
    new = release(bot)
    bot.wait(lambda r: r.release().get("revision") == new, 30, "release started")
    bot.plugin("abort", "bot")
    bot.wait(rolled_back, 30, "abort")
    # retry starts the same revision again (the abort that rolled it back is cleared with it) and the
    # healthy canary is promoted; afterwards there is nothing to retry
    out = bot.plugin("retry", "bot")
    assert f"retry of revision {new} requested" in out
    rollout = bot.body()["spec"]["rollout"]
    assert rollout.get("retry") and "abort" not in rollout
    bot.wait(lambda r: r.release().get("phase") not in (None, "RolledBack"), 30, "the release started again")
    assert bot.release()["revision"] == new and bot.release()["retry"] == rollout["retry"]
    bot.wait(promoted_to(new), 150, "promotion after the retry")
    results = [h["result"] for h in bot.status()["releaseHistory"]]
    assert results[:2] == ["Promoted", "RolledBack"], results
    assert any("again after its rollback" in e["message"] for e in bot.events("ReleaseStarted"))
    bot.plugin("retry", "bot", expect=1)  # nothing rolled back: refused (exit 1), nothing written
    assert bot.body()["spec"]["rollout"]["retry"] == rollout["retry"]
    # undo puts back the spec fields of the revision the promotion replaced (kept in its history entry):
    # the operator releases v1 again, canary and analysis included
    assert bot.status()["releaseHistory"][0]["previous"]["revision"] == first
    out = bot.plugin("undo", "bot")
    assert f"undo to revision {first} requested" in out
    assert bot.body()["spec"]["model"]["revision"] == "v1"
    bot.wait(lambda r: r.release().get("revision") == first, 30, "the undo's release started")
    bot.wait(promoted_to(first), 150, "promotion of the undo")
    assert bot.status()["releaseHistory"][0]["previous"]["revision"] == new


def test_manual_promote_and_pause_from_the_plugin(bot, prometheus, traffic):
    start(
        bot,
        prometheus,
        rollout={
            "strategy": "canary",
            "canary": {"steps": [{"weight": 10, "pauseSeconds": 600}, {"weight": 50, "pauseSeconds": 600}]},
        },
    )
    new = release(bot)
    bot.plugin("pause", "bot")
    bot.wait(lambda r: r.cond("Reconciling").get("reason") == "ReleasePaused", 30, "paused")
    tree = bot.plugin("status", "bot")
    assert "Release: Progressing, step 1" in tree and "Analysis:" in tree
    config = bot.plugin("config", "bot")  # the generated Triton config of both tracks, from their templates
    assert "# deployment/bot (track stable" in config and "# deployment/bot-canary (track canary" in config
    assert config.count('name: "chat"') == 2
    bot.plugin("resume", "bot")
    bot.plugin("promote", "bot")  # skip the 10-minute pauses
    bot.wait(promoted_to(new), 60, "manual promotion")


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


def test_a_node_lost_mid_canary_reschedules_its_pods_and_the_release_promotes(
    bot, prometheus, traffic, cluster
):
    # One long step, so the node goes more than progressDeadlineSeconds (15 s) after the step began.
    steps = [{"weight": 50, "pauseSeconds": 45}, {"weight": 100, "pauseSeconds": 0}]
    start(bot, prometheus, rollout={"strategy": "canary", "canary": {"steps": steps}})
    # The new revision's pods get Ready 8 s after they start (a model load; kwok's stage waits).
    bot.patch({"podMetadata": {"annotations": {"sim.chatfleet.io/model-load-delay": "8s"}}})
    new = bot.wait(lambda r: r.release().get("revision"), 30, "the release started")
    canary = "chatfleet.io/service=bot,chatfleet.io/track=canary"

    def canary_pods() -> list[dict]:
        return json.loads(bot.kubectl("get", "pods", "-l", canary, "-o", "json").stdout)["items"]

    def settled_canary(r: Release) -> str:
        """The canary's node once it has been Ready for a while, 20 s into the step (else '')."""
        pods = canary_pods()
        rel = r.release()
        if len(pods) != 1 or not rel.get("canaryReadyAt") or rel.get("stepIndex", 0) != 0:
            return ""
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in pods[0]["status"].get("conditions", [])
        )
        in_step = since(rel["stepStartedAt"], datetime.now(UTC))
        return pods[0]["spec"].get("nodeName", "") if ready and in_step > 20 else ""

    node = bot.wait(settled_canary, 90, "the canary Ready, 20 s into its step")
    lost = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)
    lost["metadata"] = {k: lost["metadata"][k] for k in ("name", "labels", "annotations")}
    lost.pop("spec", None)
    lost["status"] = {k: lost["status"][k] for k in ("allocatable", "capacity", "nodeInfo")}
    # A GPU node loses power and its Node goes (a cloud's node controller); its pods go with it, as the pod
    # garbage collector would do 40 s later (here at once, so the drill lands inside the step).
    cluster.kubectl("delete", "node", node, "--wait=false")
    try:
        cluster.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={node}",
            "--grace-period=0",
            "--force",
        )
        # The canary's Deployment makes a new pod on another node; the release waits for it (the progress
        # deadline counts from the loss, not from the step's start) and promotes on the same analysis.
        moved_to: set[str] = set()

        def promoted(r: Release) -> bool:
            moved_to.update(p["spec"].get("nodeName") or "" for p in canary_pods())
            return r.status().get("stableRevision") == new and not r.release()

        bot.wait(promoted, 150, "promotion")
        assert moved_to - {node, ""}, f"no canary pod seen on another node than {node}: {moved_to}"
        assert [h["result"] for h in bot.status()["releaseHistory"] if h["revision"] == new] == ["Promoted"]
        assert not bot.events("RolledBack")
    finally:
        cluster.add_nodes([lost])
