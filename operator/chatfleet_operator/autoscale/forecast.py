"""The forecast floor: demand forecast from the request-rate history, and the replica floor it asks for. Pure.

The model is statsmodels' Holt-Winters (`ExponentialSmoothing`, additive trend and additive season of
`seasonalPeriodSeconds`) once the history holds two full seasons; with less, Holt's linear trend
(`ExponentialSmoothing(trend="add")`, no season) over what there is; with fewer than MIN_POINTS samples
no forecast at all (the floor stays minReplicas). The I/O (the Prometheus range query) is the edge's
(autoscale/measure.py); here the series is given, so every case is a table test.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatfleet_operator.spec import Autoscale

#: Samples per season the history is read at (the range query's step = period / this, at least MIN_STEP).
POINTS_PER_SEASON = 48
#: Smallest step of the range query, seconds.
MIN_STEP = 5
#: Fewest samples a forecast is made from.
MIN_POINTS = 6
#: Lead added to the measured model-load time when spec.scaling.autoscale.forecast.leadSeconds is unset.
LEAD_MARGIN_SECONDS = 60
#: One-sided 95 % of a normal error: the standbys cover demand the forecast misses 19 times in 20.
ERROR_Z = 1.645


def step_seconds(period_seconds: int) -> int:
    """The range query's step: period / POINTS_PER_SEASON, at least MIN_STEP. e.g. 86400 -> 1800; 120 -> 5."""
    return max(MIN_STEP, period_seconds // POINTS_PER_SEASON)


def lead_seconds(autoscale: Autoscale, model_load_seconds: float | None) -> int:
    """forecast.leadSeconds, else the measured model-load time + 60 s. e.g. unset, load 40.4 -> 101."""
    if autoscale.forecast.lead_seconds is not None:
        return autoscale.forecast.lead_seconds
    return math.ceil((model_load_seconds or 0.0) + LEAD_MARGIN_SECONDS)


@dataclass(frozen=True)
class Demand:
    """The forecast: its peak request rate over the lead, and which model made it."""

    peak_rps: float | None
    """Peak forecast requests/s over [now, now + lead]; None: no forecast (too little history)."""
    model: str
    error_rps: float | None = None
    """How far off it may be over the lead, requests/s: the fit's root-mean-square one-step residual times
    the square root of the lead in steps (None: no forecast)."""


def forecast_peak(values: Sequence[float], step: int, period_seconds: int, lead: int) -> Demand:
    """Peak of the forecast over the next `lead` seconds from samples `step` seconds apart.

    e.g. 2 full seasons of a sine day -> Holt-Winters; 10 samples -> Holt's linear trend;
    3 samples -> no forecast. Its error: the fit's RMS one-step residual x sqrt(horizon in steps).
    """
    from statsmodels.tsa.holtwinters import ExponentialSmoothing  # heavy import, only when forecasting

    data = [max(0.0, float(v)) for v in values if v is not None and math.isfinite(v)]
    if len(data) < MIN_POINTS:
        return Demand(None, f"not enough history ({len(data)} samples, need {MIN_POINTS})")
    season = max(2, period_seconds // step)
    horizon = max(1, math.ceil(lead / step))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter of the optimizer: the fit is still usable
        if len(data) >= 2 * season:
            fit = ExponentialSmoothing(
                data, trend="add", seasonal="add", seasonal_periods=season, initialization_method="estimated"
            ).fit()
            model = f"Holt-Winters (additive trend and season of {season} samples)"
        else:
            fit = ExponentialSmoothing(data, trend="add", initialization_method="estimated").fit()
            model = f"Holt linear trend (history {len(data)} samples < two seasons of {season})"
        ahead = [float(v) for v in fit.forecast(horizon)]
        residuals = [float(r) for r in fit.resid if math.isfinite(r)]
    finite = [v for v in ahead if math.isfinite(v)]
    if not finite:
        return Demand(None, f"{model} gave no finite forecast")
    rms = math.sqrt(sum(r * r for r in residuals) / len(residuals)) if residuals else 0.0
    return Demand(max(0.0, max(finite)), model, rms * math.sqrt(horizon))


#: forecast.scaleDown: the floor guards, the autoscaler's scale-down window is the forecast's interval.
SCALE_DOWN_FORECAST = "Forecast"


def scale_down_seconds(autoscale: Autoscale, forecast: Mapping[str, Any] | None) -> int:
    """The autoscaler's scale-down stabilization window, seconds.

    scaleDownStabilizationSeconds, unless forecast.scaleDown is Forecast and the forecast holds a floor
    now (a peak in status.autoscaling.forecast): then forecast.intervalSeconds, since the floor keeps what
    the coming lead needs and is recomputed that often. e.g. Window, 300 -> 300; Forecast, interval 60,
    a forecast of 42 req/s -> 60; Forecast with the forecast failing -> 300.
    """
    fc = autoscale.forecast
    holds = (forecast or {}).get("requestsPerSecond") is not None
    if autoscale.forecasting and fc.scale_down == SCALE_DOWN_FORECAST and holds:
        return min(fc.interval_seconds, autoscale.scale_down_stabilization_seconds)
    return autoscale.scale_down_stabilization_seconds


def error_standbys(error_rps: float | None, requests_per_replica: float | None) -> int:
    """Standby replicas that cover the forecast's error: ceil(1.645 x error / requestsPerReplica), the
    share of a replica taken to the hundredth (an error of a thousandth of a replica asks for none).

    e.g. error 6 req/s, 7 per replica -> ceil(1.41) = 2; error 0.001 -> 0; error 0 -> 0; no forecast -> 0.
    """
    if error_rps is None or not requests_per_replica or not math.isfinite(error_rps):
        return 0
    return max(0, math.ceil(round(ERROR_Z * error_rps / requests_per_replica, 2)))


@dataclass(frozen=True)
class Floor:
    """The replica floor and why."""

    replicas: int
    reason: str


def replica_floor(autoscale: Autoscale, peak_rps: float | None) -> Floor:
    """max(minReplicas, ceil(peak / requestsPerReplica)), bounded by maxOverProvisionPercent and maxReplicas.

    The bound: never above floor(demand * (1 + maxOverProvisionPercent/100)) replicas, where demand =
    peak / requestsPerReplica (rounding up may cost at most that much); never below minReplicas.
    e.g. min 1, max 10, 10 rps/replica, 50 %: peak 42 -> 5; peak 12 -> 1 (ceil 2 > floor(1.8)); peak 500 -> 10;
    None -> 1.
    """
    lo, hi = autoscale.min_replicas, autoscale.max_replicas
    rpr = autoscale.forecast.requests_per_replica or 0.0
    if peak_rps is None or rpr <= 0:
        return Floor(lo, f"no forecast: minReplicas {lo}")
    demand = peak_rps / rpr
    wanted = math.ceil(demand - 1e-9)
    bound = math.floor(demand * (1 + autoscale.forecast.max_over_provision_percent / 100) + 1e-9)
    replicas = min(wanted, bound)
    why = f"forecast peak {peak_rps:.3g} req/s / {rpr:g} per replica = {demand:.2f} -> {wanted}"
    if bound < wanted:
        why += f", over-provision bound {bound}"
    if replicas < lo:
        replicas, why = lo, why + f", minReplicas {lo}"
    if replicas > hi:
        replicas, why = hi, why + f", maxReplicas {hi}"
    return Floor(replicas, why)
