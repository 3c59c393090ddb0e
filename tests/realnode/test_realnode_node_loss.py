"""A GPU node lost during a canary, on the real node: its pods rescheduled, the release neither stuck nor
falsely rolled back.

Test design: one stable replica of the tiny model on the real node, a client chatting through the Service,
and a release of one canary pod at 50 % for a long step. Once the canary has been Ready for a while, the
real node loses power (`RealNodes.lose_power`): its kubelet and every process of its pods are SIGKILLed
(no preStop, no drain), and its Node is deleted, as a cloud's node controller does for a machine that is
gone. The pods it held are deleted as the pod garbage collector does after its 40 s quarantine (here at
once, so the loss lands inside the step). The Deployments make new pods at once; they wait, Pending, until
a node can take them: the node joins again as a replacement machine of the same name (`rejoin`: a new
kubelet registers it, the fake device plugin registers its 8 GPUs again). The new pods start there.

Checked: the canary's pod after the loss is a new pod on the rejoined node; the release promotes the same
revision (its history says Promoted, it never rolled back: the progress deadline counts from the loss,
not from the step's start); once promoted, the client's requests succeed again.

It runs last in the layer (conftest): it restarts the session's kubelet. The kwok twin, with no process
killed, is tests/e2e/test_release_node_loss.py::test_a_node_lost_mid_canary_reschedules_its_pods_and_the_release_promotes.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from chatfleet_operator.timefmt import since
from chatfleet_platform.load.realpods import ChatLoad, on_real_node, service_url
from chatfleet_platform.load.releasetraffic import Bot, ready_pods, rolled_back
from test_realnode_release import bot_spec, record

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

#: The step the loss lands in: long enough that the node goes well after it began.
STEP_SECONDS = 60


@pytest.mark.timeout(1200)
def test_a_gpu_node_lost_mid_canary_rejoins_its_pods_start_again_and_the_release_promotes(
    cluster, real_operator, real_node, real_ns, pod_prometheus, runtime_image, host_model_dir
):
    bot = Bot(cluster, real_ns)
    spec = on_real_node(bot_spec(pod_prometheus.url), image=runtime_image, model_dir=host_model_dir)
    spec["rollout"]["canary"]["steps"] = [
        {"weight": 50, "pauseSeconds": STEP_SECONDS},
        {"weight": 100, "pauseSeconds": 0},
    ]
    spec["analysis"]["progressDeadlineSeconds"] = 300
    bot.apply(spec)
    bot.wait(bot.ready, 600, "stable Ready")
    load = ChatLoad(service_url(cluster, real_ns, bot.name), workers=2, max_seconds=900).start()
    try:
        bot.patch({"runtime": {"maxNewTokens": 7}})
        bot.wait(lambda: bot.status().get("release"), 60, "a release")
        new = bot.status()["release"]["revision"]

        def settled_canary() -> dict | None:
            """The canary pod once it has been Ready 10 s into the first step (else None)."""
            release = bot.status().get("release") or {}
            pods = bot.pods("canary")
            if len(pods) != 1 or ready_pods(bot, "canary") != 1 or release.get("stepIndex", 0) != 0:
                return None
            in_step = since(release.get("stepStartedAt"), datetime.now(UTC))
            return pods[0] if release.get("canaryReadyAt") and in_step > 10 else None

        before = bot.wait(settled_canary, 420, "the canary Ready, 10 s into its step")
        t_loss = time.monotonic()
        lost = cluster.realnodes.lose_power(real_node)
        # the pod garbage collector's part (after its quarantine), at once
        cluster.kubectl(
            "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={real_node.name}",
            "--grace-period=0", "--force",
        )  # fmt: skip
        cluster.realnodes.rejoin(real_node)
        t_back = time.monotonic()
        assert not rolled_back(bot), bot.cond("Stalled")

        canaries: set[tuple[str, str]] = set()

        def promoted() -> bool:
            canaries.update(
                (p["metadata"]["uid"], p["spec"].get("nodeName") or "") for p in bot.pods("canary")
            )
            assert not rolled_back(bot), f"rolled back after the node loss: {bot.cond('Stalled')}"
            return bot.status().get("stableRevision") == new and not bot.status().get("release")

        bot.wait(promoted, 600, f"promotion of {new} after the node loss")
        t_promoted = time.monotonic()
        after = {uid: node for uid, node in canaries if uid != before["metadata"]["uid"]}
        assert real_node.name in after.values(), (
            f"no new canary pod on the rejoined node (before: {before['metadata']['uid']}): {canaries}"
        )
        history = [h["result"] for h in bot.status().get("releaseHistory", []) if h.get("revision") == new]
        assert history == ["Promoted"], bot.status().get("releaseHistory")
        bot.wait(lambda: sum(load.since(t_promoted).values()) >= 3, 120, "requests after the promotion")
        assert set(load.since(t_promoted)) == {"ok"}, load.failures_since(t_promoted)
        record(
            "node_loss",
            {
                "pods_lost": len(lost),
                "seconds_loss_to_node_back": round(t_back - t_loss, 1),
                "seconds_loss_to_promotion": round(t_promoted - t_loss, 1),
                "requests_during": load.since(t_loss),
            },
        )
    finally:
        load.stop()
