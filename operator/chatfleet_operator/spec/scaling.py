"""spec.scaling: a fixed size, or the autoscaler's range, targets, forecast, warm pool, SLO and surge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chatfleet_operator.spec.fields import field_value, sub_mapping


@dataclass(frozen=True)
class AutoscaleTargets:
    """spec.scaling.autoscale.targets: per-pod averages the HPA keeps under; None = not used."""

    gpu_utilization_percent: int | None = None
    queue_time_milliseconds: int | None = None
    request_latency_milliseconds: int | None = None
    in_flight_requests: int | None = None


@dataclass(frozen=True)
class ForecastSpec:
    """spec.scaling.autoscale.forecast: a replica floor ahead of the forecast demand (docs/autoscaling.md)."""

    enabled: bool = False
    requests_per_replica: float | None = None
    """Requests/s one replica serves within the SLO (required when enabled)."""
    seasonal_period_seconds: int = 86400
    history_seconds: int | None = None
    """History read from Prometheus; None: two seasonal periods."""
    lead_seconds: int | None = None
    """How far ahead the floor looks; None: the measured model-load time + 60 s."""
    max_over_provision_percent: int = 50
    interval_seconds: int = 60
    scale_down: str = "Window"
    """Window (scaleDownStabilizationSeconds) or Forecast (the floor guards, the window is intervalSeconds)."""

    @property
    def history(self) -> int:
        """Seconds of history read: historySeconds, default two seasonal periods."""
        return self.history_seconds or 2 * self.seasonal_period_seconds

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ForecastSpec:
        """Parse spec.scaling.autoscale.forecast."""
        rpr, hist, lead = d.get("requestsPerReplica"), d.get("historySeconds"), d.get("leadSeconds")
        return cls(
            enabled=bool(d.get("enabled") or False),
            requests_per_replica=None if rpr is None else float(rpr),
            seasonal_period_seconds=int(field_value(d, "seasonalPeriodSeconds", 86400)),
            history_seconds=None if hist is None else int(hist),
            lead_seconds=None if lead is None else int(lead),
            max_over_provision_percent=int(field_value(d, "maxOverProvisionPercent", 50)),
            interval_seconds=int(field_value(d, "intervalSeconds", 60)),
            scale_down=str(field_value(d, "scaleDown", "Window")),
        )


@dataclass(frozen=True)
class SloSpec:
    """spec.scaling.autoscale.slo: the fleet's time to first token, kept by raising its floor at once."""

    ttft_p95_milliseconds: int
    """The p95 time to first token the fleet must keep (timeToFirstTokenP95Milliseconds)."""
    breach_seconds: int = 5
    """How long it must be exceeded before the floor is raised (a breach, not a blip)."""

    @property
    def check_seconds(self) -> float:
        """How often the operator measures it: twice per breach window, at least once a second."""
        return max(1.0, self.breach_seconds / 2)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SloSpec | None:
        """Parse spec.scaling.autoscale.slo; None when absent."""
        if not d or d.get("timeToFirstTokenP95Milliseconds") is None:
            return None
        return cls(int(d["timeToFirstTokenP95Milliseconds"]), int(field_value(d, "breachSeconds", 5)))


@dataclass(frozen=True)
class SurgeSpec:
    """spec.scaling.autoscale.surge: a sudden rise the fleet must absorb from loaded standbys."""

    factor: float
    """Demand may reach this many times the serving replicas' worth."""
    within_seconds: int = 10
    """...this fast: faster than a model loads, so the capacity must be loaded already."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SurgeSpec | None:
        """Parse spec.scaling.autoscale.surge; None when absent."""
        if not d or d.get("factor") is None:
            return None
        return cls(float(d["factor"]), int(field_value(d, "withinSeconds", 10)))


@dataclass(frozen=True)
class Autoscale:
    """spec.scaling.autoscale."""

    min_replicas: int = 1
    max_replicas: int = 4
    targets: AutoscaleTargets = field(default_factory=lambda: AutoscaleTargets(gpu_utilization_percent=80))
    scale_down_stabilization_seconds: int = 300
    forecast: ForecastSpec = field(default_factory=ForecastSpec)
    warm_pool: int = 0
    """warmPool.replicas: standby Ready replicas outside the Service (docs/autoscaling.md)."""
    pool_from_forecast_error: bool = False
    """warmPool.fromForecastError: the pool also covers the forecast's error (autoscale/forecast.py,
    error_standbys)."""
    slo: SloSpec | None = None
    """The time-to-first-token SLO the operator keeps by raising the floor on a breach (None: none)."""
    surge: SurgeSpec | None = None
    """The surge the warm pool is sized to absorb (None: the pool is warmPool.replicas)."""

    @property
    def forecasting(self) -> bool:
        """The forecast floor is on (enabled, with the capacity of a replica it divides by)."""
        return self.forecast.enabled and bool(self.forecast.requests_per_replica)


@dataclass(frozen=True)
class ScalingSpec:
    """spec.scaling: fixed replicas, or an autoscale range (then an HPA owns the replica count)."""

    replicas: int = 1
    autoscale: Autoscale | None = None
    replicas_set: bool = False
    """spec.scaling.replicas is present (the HPA's decision, once it has scaled the ChatbotService)."""

    @property
    def warm_pool(self) -> int:
        """Standby replicas asked for (spec.scaling.autoscale.warmPool.replicas; 0 without autoscale)."""
        return self.autoscale.warm_pool if self.autoscale is not None else 0

    @property
    def pooled(self) -> bool:
        """Whether stable pods may stand by (a warm pool, one sized from the forecast's error, or one sized
        for a surge): the serving label, the Service's selector on it, the standbys' deletion cost."""
        a = self.autoscale
        return self.warm_pool > 0 or (a is not None and (a.surge is not None or a.pool_from_forecast_error))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScalingSpec:
        """Parse spec.scaling."""
        a = d.get("autoscale")
        autoscale = None
        if isinstance(a, Mapping):
            t = a.get("targets")
            targets = (
                AutoscaleTargets(
                    gpu_utilization_percent=t.get("gpuUtilizationPercent"),
                    queue_time_milliseconds=t.get("queueTimeMilliseconds"),
                    request_latency_milliseconds=t.get("requestLatencyMilliseconds"),
                    in_flight_requests=t.get("inFlightRequests"),
                )
                if isinstance(t, Mapping) and any(v is not None for v in t.values())
                else AutoscaleTargets(gpu_utilization_percent=80)
            )
            autoscale = Autoscale(
                min_replicas=int(field_value(a, "minReplicas", 1)),
                max_replicas=int(field_value(a, "maxReplicas", 4)),
                targets=targets,
                scale_down_stabilization_seconds=int(field_value(a, "scaleDownStabilizationSeconds", 300)),
                forecast=ForecastSpec.from_dict(sub_mapping(a, "forecast")),
                warm_pool=int(field_value(sub_mapping(a, "warmPool"), "replicas", 0)),
                pool_from_forecast_error=bool(
                    field_value(sub_mapping(a, "warmPool"), "fromForecastError", False)
                ),
                slo=SloSpec.from_dict(sub_mapping(a, "slo")),
                surge=SurgeSpec.from_dict(sub_mapping(a, "surge")),
            )
        return cls(
            replicas=int(field_value(d, "replicas", 1)),
            autoscale=autoscale,
            replicas_set=d.get("replicas") is not None,
        )
