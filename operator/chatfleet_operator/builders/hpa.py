"""The HorizontalPodAutoscaler (autoscaling/v2), only when spec.scaling.autoscale is set.

It scales the ChatbotService itself, through its scale subresource (spec.scaling.replicas, pods chosen
by status.selector), not the stable Deployment: a release splits the replicas over two Deployments and
shrinks the stable one, so an HPA on that Deployment would see its own target shrink and follow it down
(the flagger#1347 / argo-rollouts#4380 class). The operator spreads spec.scaling.replicas over the
tracks, and status.selector names the pods that serve (docs/releases.md, "Autoscaling").
"""

from __future__ import annotations

from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import (
    deployment_name,
    object_meta,
    seconds_quantity,
    with_desired_hash,
)
from chatfleet_operator.settings import HpaMetricSettings
from chatfleet_operator.spec import Autoscale, ObjectRef


def _pods_metric(name: str, average_value: str) -> dict[str, Any]:
    """One `Pods` metric with an AverageValue target."""
    return {
        "type": "Pods",
        "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": average_value}},
    }


def hpa_metrics(autoscale: Autoscale, names: HpaMetricSettings) -> list[dict[str, Any]]:
    """The HPA metrics for the targets that are set, e.g. queue time 50 ms -> averageValue '50m' (s)."""
    t = autoscale.targets
    metrics = []
    if t.gpu_utilization_percent is not None:
        metrics.append(_pods_metric(names.gpu_utilization, str(t.gpu_utilization_percent)))
    if t.queue_time_milliseconds is not None:
        metrics.append(_pods_metric(names.queue_time, seconds_quantity(t.queue_time_milliseconds)))
    if t.request_latency_milliseconds is not None:
        metrics.append(_pods_metric(names.request_latency, seconds_quantity(t.request_latency_milliseconds)))
    if t.in_flight_requests is not None:
        metrics.append(_pods_metric(names.in_flight, str(t.in_flight_requests)))
    return metrics


def scale_target_ref(ref: ObjectRef) -> dict[str, str]:
    """The ChatbotService's scale subresource, what an HPA (or KEDA's) scales."""
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": ref.name}


def hpa_behavior(autoscale: Autoscale, scale_down_seconds: int | None = None) -> dict[str, Any]:
    """The HPA's behavior: the scale-down stabilization window `scale_down_seconds` (None: the spec's
    scaleDownStabilizationSeconds); scale-up keeps the HPA's default."""
    window = autoscale.scale_down_stabilization_seconds if scale_down_seconds is None else scale_down_seconds
    return {"scaleDown": {"stabilizationWindowSeconds": window}}


def build_hpa(
    ref: ObjectRef,
    autoscale: Autoscale,
    names: HpaMetricSettings,
    min_replicas: int | None = None,
    scale_down_seconds: int | None = None,
) -> dict[str, Any]:
    """HPA scaling the ChatbotService (its scale subresource) between the floor (or minReplicas) and
    maxReplicas; its scale-down window `scale_down_seconds` (None: scaleDownStabilizationSeconds)."""
    return with_desired_hash(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": object_meta(ref, deployment_name(ref)),
            "spec": {
                "scaleTargetRef": scale_target_ref(ref),
                "minReplicas": autoscale.min_replicas if min_replicas is None else min_replicas,
                "maxReplicas": autoscale.max_replicas,
                "metrics": hpa_metrics(autoscale, names),
                "behavior": hpa_behavior(autoscale, scale_down_seconds),
            },
        }
    )
