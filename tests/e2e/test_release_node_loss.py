"""A GPU node lost in the middle of a canary step, end to end (the setting of test_release_canary.py: real
apiserver + kwok pods, real Prometheus scraping a trafficsim): the canary's pod is rescheduled, and the
progress deadline counts from the loss, so the release promotes. A file of its own so that the e2e layer's
workers share the canary scenarios (pytest-xdist hands out whole files)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from chatfleet_operator.timefmt import since
from release_e2e import Release, start

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]


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
