"""Autoscaling's I/O edge: which autoscaler the cluster offers (discovery), and the forecast when due.

The reconciler asks `Autoscaling.metrics_source` while it gathers the pass's context, then
`Autoscaling.forecast_if_due`, which reads the request-rate history from Prometheus (one range query,
in the pass's worker thread) only when the forecast is due (autoscale/state.forecast_wait). It never
raises: an unreachable Prometheus or a failed fit is a reason in status.autoscaling.forecast, the floor
falls back to minReplicas and the next try waits longer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.analysis.provider import PrometheusProvider, short_error
from chatfleet_operator.analysis.targets import analysis_target_errors
from chatfleet_operator.autoscale.forecast import Demand, forecast_peak, lead_seconds, step_seconds
from chatfleet_operator.autoscale.modelload import model_load_status
from chatfleet_operator.autoscale.slo import p95_ttft_query, slo_floor, slo_step
from chatfleet_operator.autoscale.state import forecast_status, forecast_wait
from chatfleet_operator.context import PassContext
from chatfleet_operator.discovery import ServedGroup
from chatfleet_operator.settings import ReleaseSettings

log = logging.getLogger("chatfleet")

RangeQuery = Callable[[str, str, datetime, datetime, int], Sequence[tuple[float, float]]]
InstantQuery = Callable[[str, str], float | None]
#: Most samples one range query asks for (Prometheus refuses more than 11,000 per series).
MAX_POINTS = 10_000


def request_rate_query(namespace: str, name: str) -> str:
    """The fleet's request rate (the contract's query), e.g. sum(rate(chatfleet_requests_total{...}[1m]))."""
    return f'sum(rate(chatfleet_requests_total{{namespace="{namespace}",model="{name}"}}[1m]))'


class Autoscaling:
    """Discovers the autoscaler and forecasts demand for the passes of one operator process."""

    def __init__(
        self,
        serves_keda: Callable[[], bool] | None = None,
        range_query: RangeQuery | None = None,
        settings: ReleaseSettings | None = None,
        cache_seconds: float = 10.0,
        cluster_domain: str = "cluster.local",
        instant_query: InstantQuery | None = None,
    ) -> None:
        self._keda = ServedGroup("keda.sh", serves_keda, cache_seconds)
        provider = PrometheusProvider() if range_query is None or instant_query is None else None
        self._range_query = range_query or provider.query_range  # type: ignore[union-attr]
        self._instant_query = instant_query or provider.query  # type: ignore[union-attr]
        self._slo_checked: dict[tuple[str, str], datetime] = {}
        """When each fleet's SLO was last measured (this process's memory: a restart measures at once)."""
        self.settings = settings or ReleaseSettings()
        self.cluster_domain = cluster_domain

    def rediscover(self) -> None:
        """Forget the cached answer about KEDA (its CRDs appeared or went)."""
        self._keda.forget()

    def metrics_source(self) -> str:
        """KEDA when the cluster serves keda.sh/v1alpha1 (discovery, cached a few seconds), else HPA."""
        return api.METRICS_KEDA if self._keda.served() else api.METRICS_HPA

    def _refused_address(self, ctx: PassContext) -> str:
        """Why the spec's Prometheus address may not be queried ('' when it may)."""
        refused = analysis_target_errors(
            ctx.spec.analysis.probe,
            ctx.spec.analysis.prometheus_address,
            ctx.ref.namespace,
            ctx.ref.name,
            default_probe_template=self.settings.probe_url_template,
            allowed=self.settings.analysis_allowed_hosts,
            cluster_domain=self.cluster_domain,
        )
        return "; ".join(r for r in refused if "prometheusAddress" in r)

    def slo_if_due(self, ctx: PassContext) -> PassContext:
        """The context with the SLO's state (measured anew when due) and its floor: the Deployment grows in
        this pass and the autoscaler's minimum with it. Never raises: a failed query is said in the state."""
        autoscale = ctx.spec.scaling.autoscale
        if autoscale is None or autoscale.slo is None:
            return ctx
        slo, key = autoscale.slo, (ctx.ref.namespace, ctx.ref.name)
        old: dict[str, Any] = dict((ctx.old_status.get("autoscaling") or {}).get("slo") or {})
        state = old
        last = self._slo_checked.get(key)
        elapsed = None if last is None else (ctx.now - last).total_seconds()
        if elapsed is None or elapsed >= slo.check_seconds or elapsed < 0:
            p95, error = self._p95(ctx)
            self._slo_checked[key] = ctx.now
            elapsed = 0.0
            load = (ctx.model_load or {}).get("seconds")
            state = slo_step(slo, old, p95, ctx.now, ctx.total, autoscale.max_replicas, load, error)
            if state.get("reason", "") != old.get("reason", ""):
                log.info("SLO of ChatbotService %s/%s: %s", *key, state["reason"])
        floor = slo_floor(state)
        next_in = max(1.0, slo.check_seconds - elapsed)
        return replace(
            ctx,
            slo=state,
            floor=max(ctx.floor or autoscale.min_replicas, floor) if floor else ctx.floor,
            total=max(ctx.total, floor),
            forecast_in=min(ctx.forecast_in or next_in, next_in),
        )

    def _p95(self, ctx: PassContext) -> tuple[float | None, str]:
        """(the fleet's p95 time to first token in ms, '') or (None, why it was not measured). Never raises."""
        refused = self._refused_address(ctx)
        if refused:
            return None, refused
        address = ctx.spec.analysis.prometheus_address
        try:
            return self._instant_query(address, p95_ttft_query(ctx.ref.namespace, ctx.ref.name)), ""
        except Exception as exc:  # never raise: the floor stays as it is
            return None, f"Prometheus at {address} did not answer: {short_error(exc)}"

    def forget(self, key: tuple[str, str]) -> None:
        """A deleted ChatbotService: its SLO's memory goes."""
        self._slo_checked.pop(key, None)

    def _demand(self, ctx: PassContext, lead: int) -> tuple[Demand | None, str]:
        """(the forecast, '') or (None, why it failed): one range query and one fit. Never raises."""
        autoscale = ctx.spec.scaling.autoscale
        assert autoscale is not None
        fc = autoscale.forecast
        address = ctx.spec.analysis.prometheus_address
        refused = self._refused_address(ctx)
        if refused:
            return None, refused
        step = max(step_seconds(fc.seasonal_period_seconds), math.ceil(fc.history / MAX_POINTS))
        query = request_rate_query(ctx.ref.namespace, ctx.ref.name)
        try:
            series = self._range_query(address, query, ctx.now - timedelta(seconds=fc.history), ctx.now, step)
        except Exception as exc:  # never raise: the floor falls back to minReplicas
            return None, f"Prometheus at {address} did not answer: {short_error(exc)}"
        try:
            return forecast_peak([v for _, v in series], step, fc.seasonal_period_seconds, lead), ""
        except Exception as exc:  # a fit that fails on odd data is an error, not a crash
            return None, f"the forecast model failed: {type(exc).__name__}: {exc}"

    def forecast_if_due(self, ctx: PassContext) -> PassContext:
        """The context with model-load time, the forecast (new when due, else the stored one) and its floor."""
        autoscale = ctx.spec.scaling.autoscale
        if autoscale is None:
            return ctx
        old: dict[str, Any] = dict(ctx.old_status.get("autoscaling") or {})
        revisions = [ctx.update_revision, ctx.stable.revision]
        load = model_load_status(ctx.pods, revisions, old.get("modelLoadSeconds"))
        ctx = replace(ctx, model_load=load)
        if not autoscale.forecasting:
            return ctx
        lead = lead_seconds(autoscale, (load or {}).get("seconds"))
        wait = forecast_wait(autoscale, old.get("forecast"), ctx.now)
        demand, error = (None, "")
        if wait <= 0:
            demand, error = self._demand(ctx, lead)
            ref = ctx.ref
            if error:
                log.warning(
                    "Failed to forecast demand of ChatbotService %s/%s: %s", ref.namespace, ref.name, error
                )
            else:
                assert demand is not None
                log.info(
                    "Forecast demand of ChatbotService %s/%s: peak %s req/s over %d s (%s)",
                    ref.namespace,
                    ref.name,
                    "-" if demand.peak_rps is None else f"{demand.peak_rps:.3g}",
                    lead,
                    demand.model,
                )
        fc = forecast_status(autoscale, old.get("forecast"), ctx.now, lead, demand, error)
        floor = int(fc["floor"])
        total = max(floor, ctx.total)
        next_in = forecast_wait(autoscale, fc, ctx.now)
        return replace(ctx, forecast=fc, floor=floor, total=total, forecast_in=max(1.0, next_in))
