"""Autoscaling's pure pieces and one pass through them: KEDA or HPA, the forecast floor, the warm pool.

Test design: table tests for every pure function (forecast, floor, model-load time, the warm pool's
labelling, the ScalingActive condition, the ScaledObject); then passes against the fake client of
test_operator_reconcile with a fake discovery and a fake Prometheus range query, so the floor reaching
the autoscaler's minimum, the pool joining on scale-up and the pool yielding to a release that waits for
GPUs are shown without a cluster.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest
from chatfleet_operator import api
from chatfleet_operator.autoscale.forecast import forecast_peak, lead_seconds, replica_floor, step_seconds
from chatfleet_operator.autoscale.measure import Autoscaling
from chatfleet_operator.autoscale.modelload import load_seconds, model_load_status
from chatfleet_operator.autoscale.state import forecast_status, forecast_wait, scaling_condition
from chatfleet_operator.autoscale.warmpool import PodLabel, plan_serving, pool_size, pool_status, pool_waits
from chatfleet_operator.builders import build_scaledobject
from chatfleet_operator.builders.scaledobject import trigger_queries
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.converge.changes import diff_children
from chatfleet_operator.converge.diagnose import Problem
from chatfleet_operator.converge.facts import PodFacts, pod_facts, pod_signature
from chatfleet_operator.converge.status import status_events
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import Autoscale, AutoscaleTargets, ForecastSpec, ObjectRef
from operator_helpers import cbs_body
from test_operator_reconcile import NODES, NOW, FakeClient

REF = ObjectRef("shop", "bot", "uid-1")


def autoscale(**forecast) -> Autoscale:
    """min 1, max 10, 10 req/s per replica, 50 % over-provision unless given."""
    fc = {"enabled": True, "requests_per_replica": 10.0, **forecast}
    return Autoscale(min_replicas=1, max_replicas=10, forecast=ForecastSpec(**fc))


class TestForecast:
    def test_two_seasons_use_holt_winters_and_follow_the_season(self):
        day = [50 + 40 * math.sin(2 * math.pi * i / 48) for i in range(96)]
        d = forecast_peak(day, 1800, 86400, 6 * 3600)  # the next 6 h: the rising quarter of the day
        assert d.model.startswith("Holt-Winters")
        assert 80 <= d.peak_rps <= 100

    def test_shorter_history_uses_holts_trend(self):
        ramp = [10.0 + 2 * i for i in range(12)]
        d = forecast_peak(ramp, 60, 3600, 180)
        assert d.model.startswith("Holt linear trend")
        assert d.peak_rps == pytest.approx(38, abs=2)  # 3 steps ahead of 32

    def test_too_little_history_is_no_forecast(self):
        assert forecast_peak([1.0, 2.0], 60, 3600, 60).peak_rps is None

    @pytest.mark.parametrize(
        ("peak", "floor"),
        [
            pytest.param(None, 1, id="no-forecast-minReplicas"),
            pytest.param(42.0, 5, id="ceil"),
            pytest.param(12.0, 1, id="over-provision-bound-rounds-down"),
            pytest.param(500.0, 10, id="maxReplicas"),
            pytest.param(0.0, 1, id="no-traffic"),
        ],
    )
    def test_replica_floor(self, peak, floor):
        assert replica_floor(autoscale(), peak).replicas == floor

    @pytest.mark.parametrize(
        ("given", "load", "lead"),
        [
            pytest.param(None, 40.4, 101, id="measured+60"),
            pytest.param(None, None, 60, id="unmeasured"),
            pytest.param(300, 40.0, 300, id="spec"),
        ],
    )
    def test_lead(self, given, load, lead):
        assert lead_seconds(autoscale(lead_seconds=given), load) == lead

    def test_step(self):
        assert (step_seconds(86400), step_seconds(120)) == (1800, 5)

    @pytest.mark.parametrize(
        ("old", "wait"),
        [
            pytest.param(None, 0.0, id="never"),
            pytest.param({"computedAt": "2026-11-21T09:59:40Z", "requestsPerSecond": 1}, 40.0, id="20s-ago"),
            pytest.param(
                {"computedAt": "2026-11-21T09:59:40Z", "consecutiveErrors": 2}, 220.0, id="2-errors"
            ),
            pytest.param({"computedAt": "2026-11-21T09:50:00Z", "requestsPerSecond": 1}, 0.0, id="overdue"),
        ],
    )
    def test_forecast_wait(self, old, wait):
        assert forecast_wait(autoscale(interval_seconds=60), old, NOW) == wait

    def test_an_error_falls_back_to_min_and_counts(self):
        fc = forecast_status(
            autoscale(), {"consecutiveErrors": 1, "requestsPerSecond": 80}, NOW, 100, None, "down"
        )
        assert fc["floor"] == 1 and fc["consecutiveErrors"] == 2 and "down" in fc["reason"]
        assert "requestsPerSecond" not in fc

    def test_a_kept_forecast_recomputes_the_floor_from_the_spec(self):
        old = {"computedAt": "2026-11-21T09:59:50Z", "requestsPerSecond": 42.0, "model": "m", "floor": 9}
        fc = forecast_status(autoscale(), old, NOW, 100, None)
        assert fc["floor"] == 5 and fc["computedAt"] == old["computedAt"]


def pod(name, *, ready=True, serving="", track="stable", created="2026-11-21T09:00:00Z", after=40, **kw):
    """PodFacts of a pod created at `created`, Ready `after` seconds later."""
    since = ""
    if ready:
        since = (datetime.fromisoformat(created.replace("Z", "+00:00")) + timedelta(seconds=after)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
    return PodFacts(
        name,
        kw.pop("revision", "r1"),
        track,
        "Running",
        ready,
        created=created,
        ready_since=since,
        serving=serving,
        **kw,
    )


class TestModelLoad:
    def test_median_of_the_revisions_ready_pods(self):
        pods = [
            pod("a", after=40),
            pod("b", after=42),
            pod("c", after=60),
            pod("d", ready=False),
            pod("e", after=5, revision="r0"),
            pod("f", after=99, restarts=2),
        ]
        assert load_seconds(pods, "r1") == (42.0, 3)

    def test_new_revision_first_then_stable_then_the_old_value(self):
        pods = [pod("a", after=40, revision="r0")]
        assert model_load_status(pods, ["r1", "r0"], None) == {
            "revision": "r0",
            "seconds": 40.0,
            "samples": 1,
        }
        old = {"revision": "r0", "seconds": 40.0, "samples": 1}
        assert model_load_status([], ["r1", "r0"], old) == old


class TestWarmPool:
    @pytest.mark.parametrize(
        ("pods", "desired", "changes"),
        [
            pytest.param(
                [
                    pod("a", serving="true", deletion_cost=""),
                    pod("b", serving="false", deletion_cost="-100"),
                    pod("c", serving="false", deletion_cost="-100"),
                ],
                2,
                [PodLabel("b", "true", None)],
                id="scale-up-takes-a-warm-pod",
            ),
            pytest.param(
                [pod("a", serving="true"), pod("b", serving="true")],
                1,
                [PodLabel("b", "false", "-100")],
                id="scale-down-drains-one-cheap-to-delete",
            ),
            pytest.param(
                [
                    pod("a", serving="true", ready=False),
                    pod("b", serving="false", deletion_cost="-100"),
                    pod("c", serving="false", ready=False),
                ],
                1,
                [PodLabel("a", "false", "-100"), PodLabel("b", "true", None)],
                id="a-dead-serving-pod-is-replaced-at-once",
            ),
            pytest.param(
                [pod("a", serving="false"), pod("c", serving="true", track="canary")],
                1,
                [PodLabel("a", "true", None)],
                id="canary-pods-are-never-pooled",
            ),
            pytest.param(
                [pod("a", serving="true", deletion_cost=""), pod("b", serving="false", deletion_cost="-100")],
                1,
                [],
                id="steady",
            ),
        ],
    )
    def test_plan_serving(self, pods, desired, changes):
        assert plan_serving(pods, desired) == changes

    def test_status_counts_ready_standby_and_their_gpus(self):
        pods = [
            pod("a", serving="true", node_name="n"),
            pod("b", serving="false", node_name="n"),
            pod("c", serving="false", ready=False),
        ]
        assert pool_status(pods, 2, 2) == {"desired": 2, "ready": 1, "gpus": 2}

    def test_the_pool_yields_to_a_release_waiting_for_gpus(self):
        assert (pool_size(2, False), pool_size(2, True)) == (2, 0)

    def test_a_standby_pod_waiting_for_a_gpu_is_no_problem_once_enough_serve(self):
        problems = [Problem(api.Reason.UNSCHEDULABLE, "pod c: Insufficient nvidia.com/gpu")]
        pods = [pod("a", serving="true"), pod("b", ready=False, unschedulable_message="Insufficient")]
        assert pool_waits(problems, pods, 1) == []
        assert pool_waits(problems, pods, 2) == problems

    def test_the_serving_label_and_readiness_trigger_a_pass(self):
        body = {
            "metadata": {"name": "a", "labels": {api.LABEL_SERVING: "false"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t"}]},
        }
        assert pod_signature(body)[-2:] == ("false", True)
        assert pod_facts(body).ready_since == "t"


def cond(ctype, status, reason="R", message="m"):
    return {"type": ctype, "status": status, "reason": reason, "message": message}


class TestScalingActive:
    @pytest.mark.parametrize(
        ("source", "autoscaler", "keda_hpa", "status", "reason"),
        [
            pytest.param("HPA", None, None, "Unknown", "AutoscalerPending", id="hpa-not-yet"),
            pytest.param(
                "HPA",
                {
                    "metadata": {"name": "bot"},
                    "status": {
                        "conditions": [cond("ScalingActive", "False", "FailedGetPodsMetric", "no adapter")]
                    },
                },
                None,
                "False",
                "FailedGetPodsMetric",
                id="hpa-no-metrics",
            ),
            pytest.param(
                "HPA",
                {"status": {"conditions": [cond("ScalingActive", "True")]}},
                None,
                "True",
                "MetricsAvailable",
                id="hpa-ok",
            ),
            pytest.param(
                "KEDA",
                {
                    "metadata": {"name": "bot"},
                    "status": {
                        "conditions": [cond("Ready", "False", "ScaledObjectCheckFailed", "bad query")]
                    },
                },
                None,
                "False",
                "ScaledObjectCheckFailed",
                id="keda-not-ready",
            ),
            pytest.param(
                "KEDA",
                {"status": {"conditions": [cond("Ready", "True")]}},
                {"status": {"conditions": [cond("ScalingActive", "False", "FailedGetExternalMetric")]}},
                "False",
                "FailedGetExternalMetric",
                id="keda-hpa-no-metrics",
            ),
        ],
    )
    def test_condition(self, source, autoscaler, keda_hpa, status, reason):
        c = scaling_condition(source, autoscaler, keda_hpa, 3)
        assert (c["status"], c["reason"], c["observedGeneration"]) == (status, reason, 3)

    def test_one_warning_when_metrics_go_missing(self):
        bad = {"conditions": [cond("ScalingActive", "False", "FailedGetPodsMetric", "no adapter")]}
        assert [(e.type, e.reason) for e in status_events({}, bad)] == [("Warning", "FailedGetPodsMetric")]
        assert status_events(bad, bad) == []


class TestScaledObject:
    def test_triggers_per_target_and_the_floor_as_minimum(self):
        a = Autoscale(1, 6, AutoscaleTargets(in_flight_requests=4, request_latency_milliseconds=300), 120)
        so = build_scaledobject(REF, a, "http://prom.monitoring.svc:9090", min_replicas=3)
        spec = so["spec"]
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert spec["scaleTargetRef"] == {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "name": "bot",
        }
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (3, 6)
        window = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert window == {"stabilizationWindowSeconds": 120}
        inflight, latency = spec["triggers"]
        assert inflight["metricType"] == "AverageValue" and inflight["metadata"]["threshold"] == "4"
        assert (
            inflight["metadata"]["query"] == 'sum(chatfleet_inflight_requests{namespace="shop",model="bot"})'
        )
        assert latency["metricType"] == "Value" and latency["metadata"]["threshold"] == "300"

    def test_the_gpu_average_leaves_warm_pool_standbys_out(self):
        """Idle standbys (serving "false") would pull the fleet's GPU average down: a busy fleet with a warm
        pool would never scale up. Sums and rates need no such matcher (a standby adds nothing)."""
        a = Autoscale(1, 6, AutoscaleTargets(gpu_utilization_percent=70), 120)
        ((name, kind, query, threshold),) = trigger_queries(REF, a)
        assert (name, kind, threshold) == ("gpu-utilization", "Value", "70")
        assert query.startswith("100 * avg(nv_gpu_utilization{") and 'serving!="false"' in query

    def test_the_hpa_keda_controls_is_never_deleted(self):
        keda_hpa = {
            "metadata": {
                "name": "keda-hpa-bot",
                "ownerReferences": [{"kind": "ScaledObject", "name": "bot", "controller": True}],
            }
        }
        ours = {
            "metadata": {"name": "bot", "ownerReferences": [{"kind": "ChatbotService", "controller": True}]}
        }
        observed = {
            ("HorizontalPodAutoscaler", "keda-hpa-bot"): keda_hpa,
            ("HorizontalPodAutoscaler", "bot"): ours,
        }
        changes = diff_children([], observed, ["HorizontalPodAutoscaler"])
        assert [(c.verb, c.name) for c in changes] == [("delete", "bot")]


# Passes through the fake client.

SPEC = {
    "model": {"uri": "hf://a/b"},
    "analysis": {"prometheusAddress": "http://prometheus.monitoring.svc:9090"},
    "scaling": {
        "replicas": 2,
        "autoscale": {
            "minReplicas": 1,
            "maxReplicas": 8,
            "targets": {"inFlightRequests": 4},
            "forecast": {"enabled": True, "requestsPerReplica": 10, "intervalSeconds": 60},
        },
    },
}


class LabellingClient(FakeClient):
    def label_pod(self, namespace, name, labels, annotations):
        self.writes.append(("label", (name, labels[api.LABEL_SERVING])))


def scaling(keda=False, series=None, error=None):
    """An Autoscaling edge with fake discovery and a fake Prometheus range query."""

    def query(address, promql, start, end, step):
        if error:
            raise ConnectionError(error)
        return [(0.0, v) for v in series or []]

    return Autoscaling(serves_keda=lambda: keda, range_query=query)


def one_pass(body, client, snap, edge):
    return reconcile_pass(client, body, snap, World(), Settings(), NOW, autoscaling=edge)


class TestPasses:
    def test_keda_gets_a_scaledobject_with_the_floor_and_hpa_replaces_it(self):
        client, snap, body = FakeClient(), Snapshot(nodes=NODES), cbs_body(SPEC)
        ramp = [30.0 + 2 * i for i in range(12)]  # rising to 52 req/s: floor 6 ahead of it
        out = one_pass(body, client, snap, scaling(keda=True, series=ramp))
        so = snap.children[("ScaledObject", "bot")]
        assert ("HorizontalPodAutoscaler", "bot") not in snap.children
        fc = out.status["autoscaling"]["forecast"]
        assert so["spec"]["minReplicaCount"] == fc["floor"] >= 6
        assert out.status["desiredReplicas"] == fc["floor"]  # the floor raises the total at once
        assert out.status["autoscaling"]["metricsSource"] == "KEDA"
        assert out.requeue_after == 60
        body["status"] = out.status
        out = one_pass(body, client, snap, scaling(keda=False, series=ramp))
        assert ("delete", ("ScaledObject", "bot")) in client.writes
        assert snap.children[("HorizontalPodAutoscaler", "bot")]["spec"]["minReplicas"] == fc["floor"]

    def test_prometheus_down_is_a_reason_and_the_floor_is_min(self):
        client, snap, body = FakeClient(), Snapshot(nodes=NODES), cbs_body(SPEC)
        out = one_pass(body, client, snap, scaling(error="connection refused"))
        fc = out.status["autoscaling"]["forecast"]
        assert fc["floor"] == 1 and "did not answer" in fc["reason"] and fc["consecutiveErrors"] == 1
        assert out.problems == [] and out.requeue_after == 120  # the interval doubled

    def test_the_hpa_without_metrics_shows_in_status_and_one_event(self):
        client, snap, body = FakeClient(), Snapshot(nodes=NODES), cbs_body(SPEC)
        body["status"] = one_pass(body, client, snap, scaling(series=[1.0] * 10)).status
        hpa = snap.children[("HorizontalPodAutoscaler", "bot")]
        hpa["status"] = {"conditions": [cond("ScalingActive", "False", "FailedGetPodsMetric", "no adapter")]}
        client.writes.clear()
        out = one_pass(body, client, snap, scaling(series=[1.0] * 10))
        active = next(c for c in out.status["conditions"] if c["type"] == "ScalingActive")
        assert active["status"] == "False" and "no adapter" in active["message"]
        assert ("event", ("Warning", "FailedGetPodsMetric")) in client.writes

    def test_warm_pool_runs_beside_the_serving_pods_and_joins_on_scale_up(self):
        spec = {
            **SPEC,
            "scaling": {
                "replicas": 2,
                "autoscale": {
                    "minReplicas": 1,
                    "maxReplicas": 8,
                    "targets": {"inFlightRequests": 4},
                    "warmPool": {"replicas": 1},
                },
            },
        }
        pods = [
            pod("a", serving="true", node_name="n"),
            pod("b", serving="true", node_name="n"),
            pod("c", serving="false", node_name="n", deletion_cost="-100"),
        ]
        client, snap = LabellingClient(), Snapshot(nodes=NODES, pods=pods)
        out = one_pass(cbs_body(spec), client, snap, scaling())
        dep = snap.children[("Deployment", "bot")]
        assert dep["spec"]["replicas"] == 3
        assert dep["spec"]["template"]["metadata"]["labels"][api.LABEL_SERVING] == "false"
        assert snap.children[("Service", "bot")]["spec"]["selector"][api.LABEL_SERVING] == "true"
        assert out.status["selector"].endswith(f"{api.LABEL_SERVING}=true")
        assert out.status["autoscaling"]["warmPool"] == {"desired": 1, "ready": 1, "gpus": 1}
        assert [w for w in client.writes if w[0] == "label"] == []
        # the autoscaler asks for 3: the warm pod joins at once, the Deployment refills the pool
        spec["scaling"]["replicas"] = 3
        client.writes.clear()
        one_pass(cbs_body(spec), client, snap, scaling())
        assert ("label", ("c", "true")) in client.writes
        assert snap.children[("Deployment", "bot")]["spec"]["replicas"] == 4
        labels_first = [w[0] for w in client.writes].index("label") < [w[0] for w in client.writes].index(
            "apply"
        )
        assert labels_first


def test_kubectl_chatbot_status_shows_the_floor_the_pool_and_the_load():
    from chatfleet_operator.plugin import render_tree

    body = cbs_body(SPEC)
    body["status"] = {
        "desiredReplicas": 5,
        "conditions": [cond("ScalingActive", "False", "FailedGetExternalMetric", "no such metric")],
        "autoscaling": {
            "metricsSource": "KEDA",
            "forecast": {
                "floor": 5,
                "requestsPerSecond": 42.0,
                "leadSeconds": 100,
                "computedAt": "2026-11-21T09:59:00Z",
                "reason": "Holt-Winters: forecast peak 42 req/s",
            },
            "warmPool": {"desired": 1, "ready": 1, "gpus": 1},
            "modelLoadSeconds": {"revision": "r1", "seconds": 40.0, "samples": 3},
        },
    }
    text = render_tree(body, [], NOW)
    assert "Autoscaling: KEDA, desired 5, metrics False (FailedGetExternalMetric)" in text
    assert "Forecast floor 5 (peak 42 req/s over 100 s" in text and "no such metric" in text
    assert "Warm pool: 1/1 Ready, 1 GPUs held" in text and "Model load: 40.0 s" in text


class TestPoolThroughARelease:
    """The pool is the stable track's; a release waiting for GPUs gets the pool's GPUs first."""

    SPEC = {
        **SPEC,
        "scaling": {
            "replicas": 2,
            "autoscale": {"maxReplicas": 8, "targets": {"inFlightRequests": 4}, "warmPool": {"replicas": 2}},
        },
    }

    def ctx(self, canary_waits: bool):
        from chatfleet_operator.reconcile import gather_context

        canary_dep = {
            "metadata": {"name": "bot-canary"},
            "spec": {"replicas": 1, "template": {"metadata": {"labels": {api.LABEL_REVISION: "r2"}}}},
        }
        waiting = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu." if canary_waits else ""
        pods = [
            pod("c", track="canary", revision="r2", ready=not canary_waits, unschedulable_message=waiting)
        ]
        snap = Snapshot(nodes=NODES, pods=pods, children={("Deployment", "bot-canary"): canary_dep})
        return gather_context(cbs_body(self.SPEC), snap, Settings(), NOW, "ReplicaRatio", "HPA")

    @pytest.mark.parametrize(
        ("in_release", "waits", "pool"),
        [
            pytest.param(False, False, 2, id="no-release"),
            pytest.param(True, False, 2, id="release-with-gpus"),
            pytest.param(True, True, 0, id="release-waiting-for-gpus"),
        ],
    )
    def test_pool_size(self, in_release, waits, pool):
        from chatfleet_operator.release.children import warm_pool
        from chatfleet_operator.release.strategy import ReleasePlan

        plan = ReleasePlan(in_release=in_release, stable_from_spec=True, stable_replicas=1, canary_replicas=1)
        assert warm_pool(self.ctx(waits), plan) == pool

    def test_canary_pods_always_serve_and_stable_ones_stand_by_first(self):
        from chatfleet_operator.release.children import desired_children
        from chatfleet_operator.release.strategy import ReleasePlan

        plan = ReleasePlan(in_release=True, stable_from_spec=True, stable_replicas=1, canary_replicas=1)
        deps = {
            m["metadata"]["name"]: m
            for m in desired_children(self.ctx(False), plan)
            if m["kind"] == "Deployment"
        }
        labels = {n: d["spec"]["template"]["metadata"]["labels"][api.LABEL_SERVING] for n, d in deps.items()}
        assert labels == {"bot": "false", "bot-canary": "true"}
        assert deps["bot"]["spec"]["replicas"] == 3 and deps["bot-canary"]["spec"]["replicas"] == 1
