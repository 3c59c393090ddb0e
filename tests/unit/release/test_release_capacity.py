"""Autoscaling through a release: total serving capacity follows the HPA's decision, never ratchets down.

Test design: whole reconcile passes against a fake cluster, tick by tick. The fake API server echoes
applies; the fake Deployment controller makes every replica a Ready pod of the template's revision. The
fake HPA is the real algorithm on a simple load model: the fleet carries `demand` replicas' worth of
load, spread evenly over the pods the Service `bot` selects (pods it does not select get none); each
sync the HPA averages the load over the pods of its target's scale selector and, when the ratio is off
by more than the 10 % tolerance, writes ceil(ratio * pods) through the scale of its `scaleTargetRef` (a
Deployment's spec.replicas, or the ChatbotService's spec.scaling.replicas); within tolerance it keeps
the target's current count -- which is what lets a release that shrinks the HPA's target ratchet the
fleet down (the flagger#1347 / argo-rollouts#4380 class).

Invariant checked after every pass: replicas of all tracks together are at least the demand, and once
the release is over the stable Deployment runs exactly the HPA's decision.
"""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from chatfleet_operator import api
from chatfleet_operator.analysis.assess import Sample
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.converge.facts import NodeFacts, PodFacts
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.settings import Settings

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
NODES = [NodeFacts(f"gpu-{i}", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, 8) for i in range(4)]


def cbs_body(spec: dict[str, Any]) -> dict[str, Any]:
    """A ChatbotService body as the API server would hand it over."""
    meta = {"name": "bot", "namespace": "ns", "uid": "uid-1", "generation": 1}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": meta, "spec": spec}


def as_observed(manifest: dict[str, Any], rv: int) -> dict[str, Any]:
    """What the API server returns for an applied manifest."""
    obj = copy.deepcopy(manifest)
    obj["metadata"].update(resourceVersion=str(rv), uid=f"uid-{manifest['kind']}", generation=1)
    return obj


class Healthy:
    """A Prometheus that always finds the canary as good as stable."""

    def measure(self, plan, now):
        return Sample(now, 5.0, {m.check.name: 0.1 for m in plan.metrics}, {})


class FakeClient:
    """Echoes applies (a Deployment applied without replicas keeps its count, as the HPA owns it)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.rv = 100

    def apply(self, manifest):
        self.rv += 1
        obj = as_observed(manifest, self.rv)
        key = (manifest["kind"], manifest["metadata"]["name"])
        before = self.cluster.children.get(key)
        if manifest["kind"] == "Deployment" and "replicas" not in manifest["spec"]:
            obj["spec"]["replicas"] = (before or {}).get("spec", {}).get("replicas", 1)
        return obj

    def delete(self, kind, namespace, name):
        self.cluster.children.pop((kind, name), None)

    def patch_status(self, namespace, name, patch):
        return {}

    def seed_replicas(self, namespace, name, replicas):
        scaling = self.cluster.body["spec"]["scaling"]
        assert "replicas" not in scaling, "seeded over the HPA's decision"
        scaling["replicas"] = replicas

    def post_event(self, involved, type_, reason, message, now=None):
        pass


class Cluster:
    """One autoscaled ChatbotService and the cluster around it."""

    def __init__(self, strategy: str, demand: int) -> None:
        rollout: dict[str, Any] = {"strategy": strategy}
        if strategy == "canary":
            rollout["canary"] = {
                "steps": [
                    {"weight": 25, "pauseSeconds": 5, "analysis": False},
                    {"weight": 50, "pauseSeconds": 5, "analysis": False},
                    {"weight": 75, "pauseSeconds": 5, "analysis": False},
                ]
            }
        else:
            rollout["blueGreen"] = {"autoPromotion": True, "previewReplicas": 1, "scaleDownDelaySeconds": 5}
        spec = {
            "model": {"uri": "hf://org/m", "revision": "v1"},
            "scaling": {"autoscale": {"minReplicas": 1, "maxReplicas": 8}},
            "rollout": rollout,
            "analysis": {"intervalSeconds": 5, "progressDeadlineSeconds": 600},
        }
        self.body = cbs_body(spec)
        self.children: dict[tuple[str, str], dict[str, Any]] = {}
        self.client = FakeClient(self)
        self.world = World()
        self.releases = Releases(provider=Healthy())
        self.now = T0
        self.demand = self.decision = demand
        self.pass_()

    # --- the HPA --------------------------------------------------------------------------------

    def demand_changes(self, replicas: int) -> None:
        """The load changes to `replicas` pods' worth; the HPA syncs, then the operator passes."""
        self.demand = replicas
        self.pass_()

    def _selects(self, selector: dict[str, str], pod: PodFacts) -> bool:
        labels = {api.LABEL_SERVICE: "bot", api.LABEL_TRACK: pod.track, api.LABEL_REVISION: pod.revision}
        return all(labels.get(k) == v for k, v in selector.items())

    def hpa_sync(self) -> None:
        """One HPA sync (autoscaling/v2 replica calculator for a Pods metric, tolerance 0.1)."""
        hpa = self.children.get(("HorizontalPodAutoscaler", "bot"))
        if hpa is None:
            return
        target = hpa["spec"]["scaleTargetRef"]
        if target["kind"] == "Deployment":
            dep = self.children[("Deployment", target["name"])]
            current = int(dep["spec"].get("replicas", 1))
            selector = dep["spec"]["selector"]["matchLabels"]
        else:
            assert (target["apiVersion"], target["kind"], target["name"]) == (
                api.API_VERSION,
                api.KIND,
                "bot",
            )
            current = int(self.body["spec"]["scaling"].get("replicas", 0))
            raw = self.body.get("status", {}).get("selector", "")
            selector = dict(part.split("=", 1) for part in raw.split(",") if part)
            assert selector, "the ChatbotService's scale has no selector: the HPA cannot count pods"
        pods = self.pods()
        serving = [p for p in pods if self._selects(self.children[("Service", "bot")]["spec"]["selector"], p)]
        mine = [p for p in pods if self._selects(selector, p)]
        per_pod = self.demand / len(serving) if serving else 0.0
        load = sum(per_pod for p in mine if p in serving)
        ratio = load / len(mine) if mine else 1.0
        desired = current if abs(ratio - 1.0) <= 0.1 else math.ceil(ratio * len(mine))
        a = hpa["spec"]
        desired = max(a["minReplicas"], min(a["maxReplicas"], desired))
        self.decision = desired
        if desired == current:
            return
        if target["kind"] == "Deployment":
            self.children[("Deployment", target["name"])]["spec"]["replicas"] = desired
        else:
            self.body["spec"]["scaling"]["replicas"] = desired
            self.body["metadata"]["generation"] += 1

    # --- the cluster ----------------------------------------------------------------------------

    def pods(self) -> list[PodFacts]:
        """Every replica of every Deployment is a Ready pod of its template's revision."""
        out = []
        for (kind, name), dep in self.children.items():
            if kind != "Deployment":
                continue
            labels = dep["spec"]["template"]["metadata"]["labels"]
            for i in range(int(dep["spec"].get("replicas", 1))):
                out.append(
                    PodFacts(
                        f"{name}-{i}", labels[api.LABEL_REVISION], labels[api.LABEL_TRACK], "Running", True
                    )
                )
        return out

    def pass_(self, seconds: float = 1.0) -> None:
        """The HPA syncs, the Deployment controller catches up, then one reconcile pass."""
        self.now += timedelta(seconds=seconds)
        self.hpa_sync()
        for (kind, _), dep in self.children.items():
            if kind == "Deployment":
                n = int(dep["spec"].get("replicas", 1))
                dep["status"] = {
                    "observedGeneration": dep["metadata"]["generation"],
                    "replicas": n,
                    "readyReplicas": n,
                    "availableReplicas": n,
                    "updatedReplicas": n,
                }
        snap = Snapshot(children=copy.deepcopy(self.children), pods=self.pods(), nodes=NODES)
        outcome = reconcile_pass(
            self.client, self.body, snap, self.world, Settings(), self.now, self.releases
        )
        self.children = {k: copy.deepcopy(dict(v)) for k, v in snap.children.items()}
        self.body["status"] = outcome.status

    def replicas(self, track: str) -> int:
        """spec.replicas of one track's Deployment (0 when absent)."""
        name = "bot" if track == api.TRACK_STABLE else f"bot-{track}"
        dep = self.children.get(("Deployment", name))
        return int(dep["spec"].get("replicas", 1)) if dep else 0

    @property
    def capacity(self) -> int:
        """Replicas of all tracks together."""
        return sum(self.replicas(t) for t in (api.TRACK_STABLE, api.TRACK_CANARY, api.TRACK_PREVIEW))

    @property
    def releasing(self) -> bool:
        """A release is under way."""
        return bool((self.body["status"].get("release") or {}).get("phase"))

    def new_revision(self) -> None:
        """A spec change that makes a new revision (starts a release)."""
        self.body["spec"]["model"]["revision"] = "v2"
        self.body["metadata"]["generation"] += 1


def settle(c: Cluster, passes: int = 6) -> None:
    """A few passes without a release (the HPA converges on the demand)."""
    for _ in range(passes):
        c.pass_()


@pytest.mark.parametrize("strategy", ["canary", "blueGreen"])
def test_capacity_follows_the_hpa_through_a_release(strategy):
    c = Cluster(strategy, demand=4)
    settle(c)
    assert c.replicas(api.TRACK_STABLE) == 4 and c.body["status"].get("stableRevision")

    # tick 1..: a release starts; every pass keeps at least the demand's 4 replicas serving
    c.new_revision()
    seen: list[int] = []
    for tick in range(300):
        c.pass_()
        seen.append(c.capacity)
        assert c.capacity >= c.demand, f"tick {tick}: capacity {seen} fell below the demand {c.demand}"
        if tick == 8:
            assert c.releasing, "the release ended too early to take an HPA decision mid-way"
            # tick 9: the load grows to 6 replicas' worth in the middle of the release
            c.demand_changes(6)
            assert c.decision == 6, f"the HPA decided {c.decision} for a demand of 6"
        if tick > 8 and not c.releasing:
            break
    else:
        raise AssertionError(f"the release never ended: {c.body['status'].get('release')}")

    # promoted: the decision taken during the release is kept
    settle(c, 3)
    assert c.replicas(api.TRACK_STABLE) == 6, seen
    assert c.body["status"]["desiredReplicas"] == 6
    assert c.replicas(api.TRACK_CANARY) + c.replicas(api.TRACK_PREVIEW) == 0


@pytest.mark.parametrize("strategy", ["canary", "blueGreen"])
def test_an_hpa_scale_down_during_a_release_is_kept(strategy):
    c = Cluster(strategy, demand=5)
    settle(c)
    c.new_revision()
    for _ in range(4):
        c.pass_()
    assert c.releasing
    c.demand_changes(3)
    while c.releasing:
        c.pass_()
        assert c.capacity >= 3
        assert c.now < T0 + timedelta(seconds=400), "the release never ended"
    settle(c, 3)
    assert c.replicas(api.TRACK_STABLE) == 3 and c.decision == 3


@pytest.mark.parametrize(
    ("scaling", "status", "observed", "expected"),
    [
        pytest.param({"replicas": 4}, {"desiredReplicas": 2}, 1, 4, id="the-hpa-decision"),
        pytest.param({"replicas": 9}, {}, None, 6, id="clamped-to-max"),
        pytest.param({"replicas": 0}, {}, None, 1, id="clamped-to-min"),
        pytest.param({}, {"desiredReplicas": 3}, 1, 3, id="no-decision-yet-last-total"),
        pytest.param({}, {}, 5, 5, id="no-decision-no-status-the-deployment"),
        pytest.param({}, {}, None, 1, id="nothing-min"),
    ],
)
def test_autoscaled_total(scaling, status, observed, expected):
    from chatfleet_operator.context import autoscaled_total
    from chatfleet_operator.spec import Autoscale

    children = {}
    if observed is not None:
        children[("Deployment", "bot")] = {"spec": {"replicas": observed}}
    raw = {"scaling": {**scaling, "autoscale": {"minReplicas": 1, "maxReplicas": 6}}}
    got = autoscaled_total(
        Autoscale(1, 6), raw["scaling"].get("replicas"), status, children.get(("Deployment", "bot"))
    )
    assert got == expected


@pytest.mark.parametrize(
    ("strategy", "in_release", "active", "expected"),
    [
        pytest.param("canary", False, "A", "chatfleet.io/service=bot,chatfleet.io/track=stable", id="steady"),
        pytest.param("canary", True, "A", "chatfleet.io/service=bot", id="canary-both-tracks"),
        pytest.param(
            "blueGreen", True, "B", "chatfleet.io/service=bot,chatfleet.io/revision=B", id="bg-active"
        ),
    ],
)
def test_scale_selector_names_the_pods_that_take_traffic(strategy, in_release, active, expected):
    from chatfleet_operator.release.children import scale_selector
    from chatfleet_operator.release.strategy import ReleasePlan
    from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://o/m"}, "rollout": {"strategy": strategy}})
    plan = ReleasePlan(in_release, False, 1, 1, active_revision=active)
    assert scale_selector(ObjectRef("ns", "bot", "uid", 1), spec, plan) == expected


def test_an_autoscaled_object_without_replicas_gets_them_seeded_once():
    c = Cluster("canary", demand=3)
    assert c.body["spec"]["scaling"]["replicas"] >= 1  # seeded by the first pass (FakeClient checks once)
    settle(c)
    assert c.body["spec"]["scaling"]["replicas"] == 3 == c.replicas(api.TRACK_STABLE)
