"""Autoscaling through a release, with the real HPA controller of the local platform.

Test design: the operator's HorizontalPodAutoscaler scales the ChatbotService through its scale
subresource. The platform's kube-controller-manager runs the real HPA controller (sync every 15 s) but
serves no custom metrics, so its metric-driven decisions cannot be produced here. Its bounds-driven
decisions are real and need no metrics: a target below minReplicas is scaled up to it, one above
maxReplicas down to it (the HPA's "Current number of replicas below Spec.MinReplicas" rescale). So each
HPA decision is provoked by moving minReplicas or maxReplicas, and the real controller writes it to
spec.scaling.replicas -- nothing here writes the HPA's status or the scale on its behalf.

Scenario, both strategies: Ready at the HPA's 2 -> the HPA decides 4 -> a release starts and is held
(canary: spec.rollout.paused; blue-green: no promotion yet, its analysis cannot pass without
Prometheus) while the HPA decides again (up to 5, or down to 3) -> the release resumes
(spec.rollout.paused false / spec.rollout.promote "*") and promotes. At every poll stable + canary/preview replicas are at least the HPA's last decision (before
the fix they fell with the stable Deployment the release shrinks), and after promotion the stable
Deployment runs the decision taken during the release.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from operator_it import Kube, chatbot, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HPA_SYNC = 15  # --horizontal-pod-autoscaler-sync-period of the platform
STEPS = [
    {"weight": 50, "pauseSeconds": 2, "analysis": False},
    {"weight": 75, "pauseSeconds": 2, "analysis": False},
]


def spec(strategy: str, min_replicas: int, max_replicas: int = 6) -> dict[str, Any]:
    """An autoscaled H100 chatbot whose release needs no Prometheus (steps without analysis)."""
    rollout: dict[str, Any] = {"strategy": strategy}
    if strategy == "canary":
        rollout["canary"] = {"steps": STEPS}
    else:
        rollout["blueGreen"] = {"previewReplicas": 1, "autoPromotion": True, "scaleDownDelaySeconds": 2}
    return {
        "model": {"uri": "hf://org/tiny", "revision": "v1"},
        "resources": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "cpu": "1", "memory": "4Gi"},
        "scaling": {
            "autoscale": {
                "minReplicas": min_replicas,
                "maxReplicas": max_replicas,
                "targets": {"inFlightRequests": 4},
            }
        },
        "rollout": rollout,
        # Unreachable on purpose: no step analyses, and a measurement error never blocks such a step.
        "analysis": {"prometheusAddress": "http://127.0.0.1:9", "intervalSeconds": 2},
    }


def patch(kube: Kube, body: dict[str, Any]) -> None:
    """Merge-patch the ChatbotService `bot`."""
    kube.cluster.kubectl(
        "patch", "chatbotservice", "bot", "--type=merge", "-p", json.dumps(body), namespace=kube.ns
    )


def replicas(kube: Kube, name: str) -> int:
    """spec.replicas of a Deployment (0 when absent)."""
    dep = kube.get("deployment", name)
    return int(dep["spec"].get("replicas", 1)) if dep else 0


def hpa_decision(kube: Kube) -> int:
    """The HPA's decision as written to its target: the ChatbotService's spec.scaling.replicas."""
    return int(kube.get("chatbotservice", "bot")["spec"]["scaling"].get("replicas", 0))


def release_phase(kube: Kube) -> str:
    """status.release.phase ('' when no release)."""
    return ((kube.get("chatbotservice", "bot") or {}).get("status", {}).get("release") or {}).get("phase", "")


class Capacity:
    """Polls total replicas against the HPA's decisions.

    The operator needs a pass to follow a new decision, so a poll is held to the smallest decision of
    the last GRACE seconds; the ratchet this guards against stays far below for good.
    """

    GRACE = 10.0

    def __init__(self, kube: Kube, track: str) -> None:
        self.kube, self.track = kube, track
        self.seen: list[tuple[float, int, int]] = []

    def check(self) -> None:
        """One poll: stable + release track replicas vs the HPA's recent decisions."""
        now = time.monotonic()
        decided = hpa_decision(self.kube)
        total = replicas(self.kube, "bot") + replicas(self.kube, f"bot-{self.track}")
        self.seen.append((now, total, decided))
        floor = min(d for t, _, d in self.seen if t >= now - self.GRACE)
        history = [(n, d) for _, n, d in self.seen[-20:]]
        assert total >= floor, (
            f"capacity {total} below the HPA's decision {floor}; (total, decision) {history}"
        )

    def until(self, predicate, timeout: float, what: str) -> None:
        """Poll (checking capacity) until predicate(); fail with `what` at the timeout."""
        deadline = time.monotonic() + timeout
        while not predicate():
            self.check()
            assert time.monotonic() < deadline, f"timed out: {what}; history {self.seen[-20:]}"
            time.sleep(0.5)
        self.check()


@pytest.mark.parametrize(
    ("strategy", "track", "hold", "resume", "bounds", "decision"),
    [
        pytest.param(
            "canary", "canary", {"paused": True}, {"paused": False}, {"minReplicas": 5}, 5, id="canary-up"
        ),
        pytest.param(
            "blueGreen",
            "preview",
            {},
            {"promote": "*"},
            {"minReplicas": 2, "maxReplicas": 3},
            3,
            id="blue-green-down",
        ),
    ],
)
def test_capacity_follows_the_real_hpa_through_a_release(
    kube, strategy, track, hold, resume, bounds, decision
):
    kube.apply(chatbot("bot", **spec(strategy, min_replicas=2)))
    kube.wait_ready("bot", 90)
    # the HPA reads the ChatbotService's scale (seeded by the operator at minReplicas)
    assert wait_until(lambda: hpa_decision(kube) == 2 and replicas(kube, "bot") == 2, 30)
    hpa = kube.get("horizontalpodautoscaler", "bot")
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "ChatbotService"

    def able_to_scale() -> bool:
        conds = (kube.get("horizontalpodautoscaler", "bot").get("status") or {}).get("conditions") or []
        return any(c["type"] == "AbleToScale" and c["status"] == "True" for c in conds)

    assert wait_until(able_to_scale, 3 * HPA_SYNC), kube.get("horizontalpodautoscaler", "bot")

    # the real HPA decides 4 (target below the new minReplicas), the stable Deployment follows
    patch(kube, {"spec": {"scaling": {"autoscale": {"minReplicas": 4}}}})
    assert wait_until(lambda: hpa_decision(kube) == 4, 3 * HPA_SYNC), "the HPA never scaled to 4"
    assert wait_until(lambda: replicas(kube, "bot") == 4, 30)
    kube.wait_ready("bot", 60)

    # a release starts and is held mid-way; capacity never falls below the HPA's 4
    cap = Capacity(kube, track)
    patch(kube, {"spec": {"model": {"revision": "v2"}, "rollout": hold}})
    cap.until(lambda: release_phase(kube) == "Progressing", 30, "release started")
    cap.until(lambda: replicas(kube, f"bot-{track}") >= 1, 30, "release pods created")
    for _ in range(6):  # a few polls while held: no ratchet
        cap.check()
        time.sleep(1)

    # the HPA decides again during the release
    patch(kube, {"spec": {"scaling": {"autoscale": bounds}}})
    cap.until(lambda: hpa_decision(kube) == decision, 3 * HPA_SYNC, f"the HPA decides {decision}")
    patch(kube, {"spec": {"rollout": resume}})
    cap.until(lambda: release_phase(kube) == "", 120, "promotion")

    # the decision taken during the release is kept
    cap.until(lambda: replicas(kube, "bot") == decision, 30, f"stable at the HPA's {decision}")
    assert replicas(kube, f"bot-{track}") == 0
    assert hpa_decision(kube) == decision
    kube.wait_ready("bot", 60)
