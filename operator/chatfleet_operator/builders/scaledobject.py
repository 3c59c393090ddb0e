"""The KEDA ScaledObject (keda.sh/v1alpha1), written instead of the HPA when the cluster serves KEDA.

KEDA turns it into an HPA on external metrics that its own metrics adapter serves from Prometheus
queries, so the real HPA controller scales the ChatbotService (its scale subresource, as the operator's
own HPA does) with no per-pod adapter rules. Each target is one prometheus trigger (docs/metrics.md,
"KEDA"): in-flight requests as a fleet sum averaged per replica (AverageValue), the latencies and GPU
utilization as fleet averages (Value; the GPU average over serving pods only, warm-pool standbys left
out). The minimum is the forecast floor when forecasting.
"""

from __future__ import annotations

from typing import Any

from chatfleet_operator.builders.common import deployment_name, object_meta, with_desired_hash
from chatfleet_operator.builders.hpa import hpa_behavior, scale_target_ref
from chatfleet_operator.spec import Autoscale, ObjectRef

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"


def _labels(ref: ObjectRef) -> str:
    """PromQL matchers of the chat API's series of this ChatbotService, e.g. namespace="shop",model="bot"."""
    return f'namespace="{ref.namespace}",model="{ref.name}"'


def _pods(ref: ObjectRef) -> str:
    """PromQL matchers of Triton's series of this ChatbotService's pods (their model label is Triton's)."""
    return f'namespace="{ref.namespace}",pod=~"{ref.name}-(canary-|preview-)?[a-z0-9]+-[a-z0-9]+"'


#: PromQL matcher leaving warm-pool standbys out: their pods carry chatfleet.io/serving "false", which the
#: chart's PodMonitor attaches to their series as `serving` (pods without a pool have none: kept).
NOT_STANDBY = 'serving!="false"'


def trigger_queries(ref: ObjectRef, autoscale: Autoscale) -> list[tuple[str, str, str, str]]:
    """(trigger name, metricType, query, threshold) per target that is set.

    e.g. inFlightRequests 4 -> ("inflight", "AverageValue", 'sum(chatfleet_inflight_requests{namespace="shop",
    model="bot"})', "4"): KEDA's HPA divides the fleet sum by the replicas, so 4 per replica.
    """
    t, sel, pods = autoscale.targets, _labels(ref), _pods(ref)
    out = []
    if t.in_flight_requests is not None:
        q = f"sum(chatfleet_inflight_requests{{{sel}}})"
        out.append(("inflight", "AverageValue", q, str(t.in_flight_requests)))
    if t.queue_time_milliseconds is not None:
        q = (
            f"sum(rate(nv_inference_queue_duration_us{{{pods}}}[1m])) / 1000"
            f" / clamp_min(sum(rate(nv_inference_request_success{{{pods}}}[1m])), 1e-9)"
        )
        out.append(("queue-time-ms", "Value", q, str(t.queue_time_milliseconds)))
    if t.request_latency_milliseconds is not None:
        q = (
            f"1000 * sum(rate(chatfleet_request_duration_seconds_sum{{{sel}}}[1m]))"
            f" / clamp_min(sum(rate(chatfleet_request_duration_seconds_count{{{sel}}}[1m])), 1e-9)"
        )
        out.append(("latency-ms", "Value", q, str(t.request_latency_milliseconds)))
    if t.gpu_utilization_percent is not None:
        # an average over pods: idle standbys would pull it down (a busy fleet with a pool never scaling
        # up), so they are left out; the sums and rates above get nothing from a pod that serves nothing
        q = f"100 * avg(nv_gpu_utilization{{{pods},{NOT_STANDBY}}})"
        out.append(("gpu-utilization", "Value", q, str(t.gpu_utilization_percent)))
    return out


def build_scaledobject(
    ref: ObjectRef,
    autoscale: Autoscale,
    prometheus: str,
    min_replicas: int | None = None,
    scale_down_seconds: int | None = None,
) -> dict[str, Any]:
    """ScaledObject scaling the ChatbotService between the floor (or minReplicas) and maxReplicas; its
    HPA's scale-down window `scale_down_seconds` (None: scaleDownStabilizationSeconds)."""
    triggers = [
        {
            "type": "prometheus",
            "name": name,
            "metricType": metric_type,
            "metadata": {
                "serverAddress": prometheus,
                "query": query,
                "threshold": threshold,
                "ignoreNullValues": "true",
            },
        }
        for name, metric_type, query, threshold in trigger_queries(ref, autoscale)
    ]
    return with_desired_hash(
        {
            "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
            "kind": "ScaledObject",
            "metadata": object_meta(ref, deployment_name(ref)),
            "spec": {
                "scaleTargetRef": scale_target_ref(ref),
                "minReplicaCount": autoscale.min_replicas if min_replicas is None else min_replicas,
                "maxReplicaCount": autoscale.max_replicas,
                "advanced": {
                    "horizontalPodAutoscalerConfig": {"behavior": hpa_behavior(autoscale, scale_down_seconds)}
                },
                "triggers": triggers,
            },
        }
    )
