"""status.autoscaling and the ScalingActive condition, from what one pass observed. Pure.

- `forecast_wait` says when the forecast is due again (intervalSeconds, doubled per consecutive error,
  at most MAX_FORECAST_WAIT): the timer the controller requeues on, never a hot loop.
- `forecast_status` folds a new Demand (or an error, or nothing new) into status.autoscaling.forecast;
  the floor itself is recomputed every pass from the stored peak, so a spec change (min, max,
  requestsPerReplica) applies at once without a new query.
- `scaling_condition` reads the autoscaler's own word on its metrics (the HPA's ScalingActive, the KEDA
  ScaledObject's Ready and its HPA's ScalingActive) into a ChatbotService condition; an event follows
  from the old -> new difference (converge/status.status_events).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.autoscale.forecast import Demand, error_standbys, replica_floor
from chatfleet_operator.spec import Autoscale
from chatfleet_operator.timefmt import parse_time, rfc3339

#: Longest wait between two forecasts after errors, seconds.
MAX_FORECAST_WAIT = 600.0


def forecast_wait(autoscale: Autoscale, old: Mapping[str, Any] | None, now: datetime) -> float:
    """Seconds until the forecast is due (0: now). e.g. interval 60, computed 20 s ago -> 40; 2 errors -> 220.

    Due at once when there is none yet, or it predates the spec's forecast being turned on.
    """
    old = old or {}
    computed = parse_time(str(old.get("computedAt") or ""))
    if computed is None or ("requestsPerSecond" not in old and "consecutiveErrors" not in old):
        return 0.0
    errors = int(old.get("consecutiveErrors") or 0)
    wait = min(MAX_FORECAST_WAIT, autoscale.forecast.interval_seconds * 2.0 ** min(errors, 8))
    return max(0.0, (computed + timedelta(seconds=wait) - now).total_seconds())


def forecast_status(
    autoscale: Autoscale,
    old: Mapping[str, Any] | None,
    now: datetime,
    lead: int,
    demand: Demand | None,
    error: str = "",
) -> dict[str, Any]:
    """status.autoscaling.forecast after this pass: a new Demand, an error, or (both None/'') the old one kept.

    e.g. Demand(42.0, "Holt-Winters ...") with 10 req/s per replica -> floor 5, reason "Holt-Winters ...:
    forecast peak 42 req/s / 10 per replica = 4.20 -> 5". An error keeps no peak: the floor is minReplicas
    and the reason names the error.
    """
    old = dict(old or {})
    stamp = rfc3339(now)
    if error:
        fc: dict[str, Any] = {
            "computedAt": stamp,
            "model": f"forecast failed: {error}",
            "consecutiveErrors": int(old.get("consecutiveErrors") or 0) + 1,
        }
    elif demand is not None:
        fc = {"computedAt": stamp, "model": demand.model, "consecutiveErrors": 0}
        if demand.peak_rps is not None:
            fc["requestsPerSecond"] = round(demand.peak_rps, 3)
        if demand.peak_rps is not None and demand.error_rps is not None:
            fc["errorRequestsPerSecond"] = round(demand.error_rps, 3)
    else:
        kept = ("computedAt", "model", "consecutiveErrors", "requestsPerSecond", "errorRequestsPerSecond")
        fc = {k: old[k] for k in kept if k in old}
    if autoscale.pool_from_forecast_error:
        fc["standbys"] = error_standbys(
            fc.get("errorRequestsPerSecond"), autoscale.forecast.requests_per_replica
        )
    floor = replica_floor(autoscale, fc.get("requestsPerSecond"))
    fc["floor"] = floor.replicas
    fc["leadSeconds"] = lead
    fc["reason"] = f"{fc.get('model') or 'no forecast yet'}: {floor.reason}"
    return fc


def _condition_of(body: Mapping[str, Any] | None, ctype: str) -> Mapping[str, Any] | None:
    """A condition of an observed object's status (None when absent)."""
    for c in ((body or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def scaling_condition(
    source: str,
    autoscaler: Mapping[str, Any] | None,
    keda_hpa: Mapping[str, Any] | None,
    generation: int,
) -> dict[str, Any]:
    """The ScalingActive condition (no timestamp): can the autoscaler read its metrics?

    `autoscaler` is the operator's HPA (source HPA) or ScaledObject (source KEDA); `keda_hpa` the HPA KEDA
    made from the ScaledObject. False keeps the autoscaler's reason (e.g. FailedGetPodsMetric) and names
    the object and its message; Unknown until the autoscaler has said anything.
    """

    def cond(status: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": api.COND_SCALING_ACTIVE,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
        }

    hpa = keda_hpa if source == api.METRICS_KEDA else autoscaler
    hpa_name = ((hpa or {}).get("metadata") or {}).get("name", "")
    if source == api.METRICS_KEDA:
        so_name = ((autoscaler or {}).get("metadata") or {}).get("name", "")
        ready = _condition_of(autoscaler, "Ready")
        if ready is not None and ready.get("status") == "False":
            return cond(
                "False",
                ready.get("reason") or api.Reason.METRICS_UNAVAILABLE,
                f"KEDA ScaledObject {so_name} is not Ready: {ready.get('message') or ready.get('reason')}",
            )
    active = _condition_of(hpa, "ScalingActive")
    if active is not None and active.get("status") == "False":
        return cond(
            "False",
            active.get("reason") or api.Reason.METRICS_UNAVAILABLE,
            f"HorizontalPodAutoscaler {hpa_name} cannot read its metrics: {active.get('message') or ''}".rstrip(),
        )
    if active is not None and active.get("status") == "True":
        return cond(
            "True", api.Reason.METRICS_AVAILABLE, f"HorizontalPodAutoscaler {hpa_name} reads its metrics"
        )
    return cond(
        "Unknown", api.Reason.AUTOSCALER_PENDING, f"Waiting for the {source} autoscaler to read its metrics"
    )
