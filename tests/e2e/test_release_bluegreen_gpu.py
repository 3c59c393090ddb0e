"""Blue-green releases and GPU scarcity end to end (real apiserver + kwok, real Prometheus + trafficsim).

Test design: blue-green runs the new revision behind the preview Service `bot-preview`; the trafficsim
sends smoke traffic to the preview track for the pre-promotion analysis; promotion switches the active
Service's revision selector at once and keeps the old pods for the scale-down delay. The GPU scenario
fills the only L4 node (4 GPUs) with 2 replicas x 2 GPUs, so a surge canary pod cannot be scheduled.
"""

from __future__ import annotations

import pytest
from release_e2e import Release, bot_spec, promoted_to, rolled_back

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

BLUE_GREEN = {
    "strategy": "blueGreen",
    "blueGreen": {"previewReplicas": 1, "autoPromotion": True, "scaleDownDelaySeconds": 4},
}


def start(bot: Release, prometheus, **over) -> str:
    """Create the bot on v1 and wait for Ready; its stable revision."""
    bot.apply(bot_spec(prometheus.url, **over))
    bot.wait(lambda r: r.cond("Ready").get("status") == "True", 60, "bot Ready on v1")
    return bot.status()["stableRevision"]


def test_blue_green_promotion(bot, prometheus, traffic):
    stable = start(bot, prometheus, rollout=BLUE_GREEN)
    assert bot.service_selector()["chatfleet.io/revision"] == stable
    bot.patch({"model": {"revision": "v2"}})
    # tick 1: preview Deployment (1 pod) behind bot-preview; the active Service stays on the old revision
    bot.wait(lambda r: r.release().get("phase") == "Progressing", 30, "preview started")
    new = bot.release()["revision"]
    assert bot.service_selector("bot-preview")["chatfleet.io/track"] == "preview"
    # ticks: preview Ready + analysis passes -> preview scaled to full size -> the active Service switches
    bot.wait(lambda r: r.service_selector().get("chatfleet.io/revision") == new, 120, "switch")
    # the old revision's pods are still there for an instant rollback during the scale-down delay
    assert bot.deployment("bot")["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == stable
    bot.wait(promoted_to(new), 90, "promotion finished")
    assert bot.deployment("bot")["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == new
    assert bot.deployment("bot-preview")["spec"]["replicas"] == 0


def test_blue_green_pre_promotion_failure(bot, prometheus, traffic):
    stable = start(bot, prometheus, rollout=BLUE_GREEN)
    traffic.set("preview", error_rate=0.3)
    bot.patch({"model": {"revision": "v2"}})
    # pre-promotion analysis fails twice -> rollback; the active Service never left the old revision
    bot.wait(rolled_back, 90, "pre-promotion rollback")
    assert bot.service_selector()["chatfleet.io/revision"] == stable
    assert "error rate" in bot.status()["abortReason"]
    assert bot.deployment("bot-preview")["spec"]["replicas"] == 0


def test_no_spare_gpu(bot, prometheus, traffic):
    l4 = {"gpuProduct": "NVIDIA-L4", "gpusPerReplica": 2, "cpu": "1", "memory": "4Gi"}
    start(bot, prometheus, resources=l4)
    # the L4 node's 4 GPUs are all taken by the 2 stable pods; a surge canary pod cannot be scheduled
    bot.patch({"model": {"revision": "v2"}})
    seen: dict[str, bool] = {}

    def watch(r: Release) -> bool:
        rel = r.release()
        if rel.get("waitingForGPUs") or r.cond("Reconciling").get("reason") == "WaitingForGPUs":
            seen["waiting"] = True
        if rel.get("capacity") == "ReplaceInPlace":
            seen["in_place"] = True
        return seen.get("in_place", False)

    # tick: canary Pending (Insufficient nvidia.com/gpu) -> status says so -> Auto replaces in place:
    # one stable pod gives its GPUs to the canary pod
    bot.wait(watch, 60, "switch to replace-in-place")
    # status said so: waitingForGPUs while Pending, and the note when Auto switched to in-place
    assert seen.get("waiting") or "no spare GPU" in bot.release().get("capacityNote", "")
    new = bot.release()["revision"]
    bot.wait(promoted_to(new), 150, "promotion without a spare GPU")
