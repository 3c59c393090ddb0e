"""The autoscaling benchmark's fair run (bench/autoscale_bench.py --ramp), checked without a cluster.

Test design: the fair run must compress nothing (the loops at their real periods, a 24 h day), measure
one hour of the steepest morning ramp after a lead-in, size the static fleet for the whole day's peak and
the surge, and give the forecast a history that continues the replay's own timeline. All pure, on tables.
No speed is asserted (benchmarks are not tests).
"""

from __future__ import annotations

import sys

import pytest
from chatfleet_platform.common.config import REPO_ROOT
from chatfleet_platform.load.fleetsim import DayCurve

sys.path.insert(0, str(REPO_ROOT / "bench"))

import autoscale_bench as ab

pytestmark = pytest.mark.harness


def test_the_fair_run_compresses_nothing():
    s = ab.parse(["--ramp"])
    assert s.real_seconds_per_bench_second == 1.0
    assert s.loop == {
        "hpa_sync_seconds": 15,
        "scrape_seconds": 15,
        "keda_polling_seconds": 30,
        "scale_down_stabilization_seconds": 300,
        "forecast_interval_seconds": 60,
        "forecast_extra_lead_seconds": 60,
    }
    assert s.measured_seconds == 3600 and s.run_seconds == 3600 + 600
    assert s.replay_start == s.measured_start - 600
    at, _ = s.surge_window
    assert at == s.measured_start + 1200
    # the day mode keeps its compression
    day = ab.parse([])
    assert day.real_seconds_per_bench_second == 240 and day.loop["hpa_sync_seconds"] == 5


def test_the_measured_hour_is_the_steepest_of_the_morning():
    s = ab.parse(["--ramp"])
    curve = DayCurve(s.night_rps, s.night_rps * s.peak_factor, s.day_seconds)
    rise = curve.daily(s.measured_end) - curve.daily(s.measured_start)
    for other in (s.measured_start - 3600, s.measured_start + 3600, 0.0, 6 * 3600.0):
        assert curve.daily(other + 3600) - curve.daily(other) <= rise
    assert 0 < s.measured_start < s.day_seconds / 2


def test_the_static_fleet_is_sized_for_the_days_peak_and_the_autoscalers_allow_for_the_surge():
    s = ab.parse(["--ramp"])
    surge_peak = s.curve().peak_over(s.measured_start, s.measured_end)
    day_peak = s.night_rps * s.peak_factor
    assert surge_peak > 2 * day_peak  # 5x of a mid-morning level
    sizes = s.sizes()
    assert sizes["static"] == ab.replicas_for(day_peak, s.replica, p95_wait=s.slo_ms / 2000)
    assert sizes["max"] * s.capacity_rps * s.target_utilization >= surge_peak
    # the compressed day sizes it for the surge too (5x near night is about the peak)
    day = ab.parse([])
    top = day.curve().peak_over(0, day.run_seconds)
    assert day.sizes()["static"] == ab.replicas_for(top, day.replica, p95_wait=day.slo_ms / 2000)


def test_the_history_continues_the_replays_timeline():
    curve = DayCurve(10.0, 10.0, 86400.0)  # flat 10 req/s
    text = ab.history_openmetrics(curve, 0.0, 60.0, 1000.0, ["as-predictive"])
    lines = text.splitlines()
    assert lines[0] == "# TYPE chatfleet_requests counter" and lines[-1] == "# EOF"
    samples = [line.rsplit(" ", 2) for line in lines[1:-1]]
    assert [float(v) for _, v, _ in samples] == [0.0, 150.0, 300.0, 450.0]
    assert [float(t) for _, _, t in samples] == [1000.0, 1015.0, 1030.0, 1045.0]
    assert all(
        series == 'chatfleet_requests_total{namespace="as-predictive",model="chat"}'
        for series, _, _ in samples
    )


def test_the_summary_reports_attainment_gpu_hours_and_the_surge_apart():
    s = ab.parse(["--ramp"])
    start, end = s.measured_start, s.measured_end
    surge_start, surge_end = s.surge_window

    def rows(ns: str, gpus: int, slow: set[str]) -> list[dict]:
        out = []
        for i in range(int(start), int(end)):
            in_surge = surge_start <= i < surge_end
            wait = 1.0 if ("surge" in slow and in_surge) or ("all" in slow and i % 100 == 0) else 0.01
            out.append({"namespace": ns, "t": float(i), "wait_p95": wait, "wait_mean": wait / 2,
                        "timed_out": 0, "rate": 10.0, "gpus": gpus, "pods": gpus})  # fmt: skip
        return out

    truth = rows("as-static", 10, set()) + rows("as-reactive", 5, {"surge"}) + rows("as-oracle", 4, {"all"})
    out = ab.summarize(truth, s, {"static": "as-static", "reactive": "as-reactive", "oracle": "as-oracle"})
    assert out["static"]["gpu_hours"] == 10.0 and out["static"]["slo_attainment_percent"] == 100.0
    surge_seconds = surge_end - surge_start
    assert out["reactive"]["seconds_over_slo"] == surge_seconds
    assert out["reactive"]["surge"]["slo_attainment_percent"] == 0.0
    assert out["reactive"]["outside_surge"]["slo_attainment_percent"] == 100.0
    assert out["reactive"]["gpu_hours_vs_static"] == 0.5 and out["reactive"]["gpu_hours_vs_oracle"] == 1.25
    assert out["reactive"]["goal_day_met"] is False  # 1.25x the oracle's GPU-hours, and the surge missed
    assert "day_minutes_over_slo" not in out["reactive"]  # an hour, not a day


def test_every_row_starts_where_the_replay_starts():
    """The fair run begins mid-morning: an autoscaled row starting at the night's minimum would spend the
    lead-in catching up (and its scale-down window holding the catch-up), which is no morning's story."""
    s = ab.parse(["--ramp"])
    morning = ab.replicas_for(s.curve().rate(s.replay_start), s.replica, p95_wait=s.slo_ms / 2000)
    assert morning > s.sizes()["min"]
    for kind in ("reactive", "predictive", "slo", "surge"):
        assert ab.initial_replicas(kind, s) == morning
        assert ab.config_spec(kind, s, "http://p", {})["scaling"]["replicas"] == morning
    assert ab.initial_replicas("oracle", s) == ab.oracle_target(s, s.curve(), s.replay_start)
    day = ab.parse([])  # the compressed day starts at night
    assert ab.initial_replicas("reactive", day) == day.sizes()["min"]
