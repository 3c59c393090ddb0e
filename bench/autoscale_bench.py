"""`make bench-autoscale`: a compressed day of chat traffic and a sudden surge, six ways of sizing the fleet.

Six ChatbotServices, one per namespace, see the same demand at the same time:

  static      spec.scaling.replicas sized for the highest demand of the day (surge included)
  reactive    spec.scaling.autoscale with an in-flight target: the operator's autoscaler (KEDA -> HPA)
  predictive  reactive + spec.scaling.autoscale.forecast (floor ahead of demand; scale-down follows it,
              .forecast.scaleDown Forecast) + .warmPool sized from the forecast's error (.fromForecastError)
  slo         predictive + spec.scaling.autoscale.slo (the p95 time to first token kept: a sustained breach
              raises the floor at once, and the warm pool's standbys join at once); target = the queue-wait
              SLO + one replica's own time to first token
  surge       slo + spec.scaling.autoscale.surge (the bench's surge declared: 5x within 10 s): the warm
              pool sized to absorb it, loaded ahead
  oracle      a loop here that knows the curve and sets spec.scaling.replicas `load + margin` seconds
              ahead of demand (no autoscale): the cheapest fleet that never waits for a model to load

What is real: the local Kubernetes (kwok GPU nodes), kube-controller-manager's HPA controller, KEDA's
operator and metrics adapter, the Chatfleet operator, Prometheus scraping the fleet. What is simulated:
the pods run no containers; `chatfleet_platform.load.fleetsim` gives each serving replica a capacity and a
model-load time and models the queue (fluid backlog + M/M/m, see its docstring), exporting the runtime's
metric names per pod and the ground-truth queue wait of every second.

Time: one day is compressed into --day-seconds (default 360 s: 240x). Control loops are compressed by
--loop-compression (default 3x), all alike: the HPA sync period 15 s -> 5 s, the Prometheus scrape 15 s
-> 5 s, KEDA's polling 30 s -> 10 s, the scale-down stabilization 300 s -> 100 s, the forecast interval
60 s -> 20 s, its extra lead 60 s -> 20 s. The model-load time (--load-seconds, default 40 s) and the surge
(x5 the level it starts from, within 10 s, held 60 s, early in the measured day) are in bench seconds as given. The loops are compressed far less than the day,
so a day's ramp is steep for them: a harder test than a real day, the same for all four.

Before the measured day, --history-days (default 2) uncompressed-shape days run so the forecast has
history (seasonal period = the compressed day); the surge happens only in the measured day.

--ramp (`make bench-autoscale-ramp`): the fair run, nothing compressed. The day is 24 h and every loop
runs at its real period (HPA 15 s, scrape 15 s, KEDA 30 s, scale-down stabilization 300 s, forecast
60 s); the replay is one hour of the morning ramp (the steepest hour of the day's curve) after a lead-in
(--lead-in-seconds, default 600 s, not measured), with the surge --surge-into-slice seconds into the hour
(default 1,200 s). The forecast's two days of history are written into Prometheus' TSDB before it starts
(`promtool tsdb create-blocks-from openmetrics`: the request counter of each fleet, from the same curve,
no surge), so the forecast sees a real day's season at a real step. GPU-hours are those of the measured
hour (real hours), not a day's; the static fleet is still sized for the whole day's peak and the surge,
as a static fleet must be.

Reported in both modes: SLO attainment (% of the measured seconds with p95 queue wait within the SLO),
GPU-hours and their ratio to the static fleet's and the oracle's, and the surge's window (from its start
to 120 s after it ends) apart from the rest.

Report per configuration: minutes of the day over the latency SLO (p95 queue wait > --slo-ms), worst p95
wait, GPU-hours (pods holding GPUs, warm pool included), ratios to reactive and to oracle, and the goals
(time over SLO <= 10 % of reactive; GPU-hours <= 1.15x oracle). Writes bench-results/autoscale.json and
bench-results/autoscale.png. A configuration the build cannot run (the CRD lacks forecast/warmPool) is
reported as not available, never faked.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

import kubernetes  # noqa: E402
from chatfleet_platform.cluster.cluster import STAGES_FILE, Cluster  # noqa: E402
from chatfleet_platform.common import procs  # noqa: E402
from chatfleet_platform.common.config import (  # noqa: E402
    CHATBOT_CRD_FILE,
    CHATBOT_CRD_NAME,
    LOCAL_ANALYSIS_ARGS,
    PlatformError,
)
from chatfleet_platform.load.fleetsim import DayCurve, Replica, Surge, kwok_load_annotation, replicas_for  # noqa: E402
from chatfleet_platform.servers import services  # noqa: E402

RESULTS = REPO / "bench-results"
#: Seconds the fair run allows from its start to the replay: the platform, KEDA, the first pods.
SETUP_SECONDS = 300.0
DATA = REPO / ".work" / "bench-autoscale-data"
GROUP, VERSION, PLURAL = "chatfleet.io", "v1alpha1", "chatbotservices"
NAME = "chat"
CONFIGS = ("static", "reactive", "predictive", "slo", "surge", "oracle")
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def say(msg: str) -> None:
    """Progress line."""
    print(f"[bench-autoscale] {msg}", flush=True)


# ---- settings (pure) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """Everything the run depends on (the JSON records it)."""

    day_seconds: float = 360.0
    history_days: int = 2
    loop_compression: float = 3.0
    load_seconds: float = 40.0
    capacity_rps: float = 10.0
    service_seconds: float = 2.0
    night_rps: float = 12.0
    peak_factor: float = 5.0
    surge_factor: float = 5.0
    surge_at: float = 0.03
    """Where in the measured day the surge starts (fraction of the day; early, near the night level, so
    surge and recovery fall inside the measured day and 5x stays near the daily peak)."""
    surge_hold: float = 60.0
    slo_ms: float = 300.0
    """Latency SLO: p95 queue wait, milliseconds."""
    target_utilization: float = 0.7
    """In-flight target per replica as a share of its slots (70 %, the design documents' GPU target)."""
    warm_pool: int = 0
    """warmPool.replicas of the forecasting rows: the least the pool holds beside what the forecast's error
    asks (warmPool.fromForecastError)."""
    oracle_margin: float = 8.0
    """Seconds from a spec change to a pod Ready (operator, Deployment, scheduler, kwok), for the oracle."""
    nodes: int = 16
    seed: int = 7
    configs: tuple[str, ...] = CONFIGS
    ramp: bool = False
    """The fair run: the day uncompressed, the loops at their real periods, one hour of the morning ramp
    measured, the forecast's history written into Prometheus (module docstring)."""
    slice_seconds: float = 3600.0
    lead_in_seconds: float = 600.0
    surge_into_slice: float = 1200.0

    @property
    def loop(self) -> dict[str, float]:
        """Control-loop periods in bench seconds (real defaults / loop_compression)."""
        c = self.loop_compression
        return {
            "hpa_sync_seconds": max(1, round(15 / c)),
            "scrape_seconds": max(1, round(15 / c)),
            "keda_polling_seconds": max(1, round(30 / c)),
            "scale_down_stabilization_seconds": round(300 / c),
            "forecast_interval_seconds": max(5, round(60 / c)),
            "forecast_extra_lead_seconds": round(60 / c),
        }

    @property
    def replica(self) -> Replica:
        """One simulated replica."""
        return Replica(self.capacity_rps, self.service_seconds, load_seconds=self.load_seconds)

    @property
    def measured_start(self) -> float:
        """Curve time the measured window begins: after the history days, or the ramp's steepest hour."""
        if self.ramp:
            return steepest_hour(self.night_rps, self.night_rps * self.peak_factor, self.day_seconds)
        return self.history_days * self.day_seconds

    @property
    def measured_seconds(self) -> float:
        """Length of the measured window: one day, or one hour of the ramp."""
        return self.slice_seconds if self.ramp else self.day_seconds

    @property
    def measured_end(self) -> float:
        return self.measured_start + self.measured_seconds

    @property
    def replay_start(self) -> float:
        """Curve time the replay begins: 0 (history days replayed), or the lead-in before the ramp's hour."""
        return self.measured_start - self.lead_in_seconds if self.ramp else 0.0

    @property
    def run_seconds(self) -> float:
        """Seconds replayed: history days + the measured day, or the lead-in + the hour."""
        return self.measured_end - self.replay_start

    @property
    def real_seconds_per_bench_second(self) -> float:
        """1 in the fair run; 240 for a 360 s day."""
        return 86400.0 / self.day_seconds

    @property
    def surge_window(self) -> tuple[float, float]:
        """Curve times of the surge: its start to 120 s after it ends (rise 10 s + hold)."""
        at = self.curve().surges[0].at
        return at, at + 10.0 + self.surge_hold + 120.0

    def curve(self) -> DayCurve:
        """The demand every configuration sees: the daily curve, the surge in the measured window."""
        at = self.measured_start + (self.surge_into_slice if self.ramp else self.surge_at * self.day_seconds)
        surge = Surge(at=at, factor=self.surge_factor, rise=10.0, hold=self.surge_hold)
        return DayCurve(self.night_rps, self.night_rps * self.peak_factor, self.day_seconds, surges=(surge,))

    def sizes(self) -> dict[str, int]:
        """Static fleet, autoscale min/max: from the queue model at the day's extremes.

        The static fleet runs all day, so it is sized for the day's peak; in the compressed day the surge
        comes near the night level and 5x of it is about that peak, so it is sized for both. In the fair
        run the surge comes mid-morning, 5x of a level already high (about 3x the day's peak): the static
        fleet is sized for the day's peak alone (what a team would run), and the surge's own columns say
        what that costs it. maxReplicas of the autoscaled rows allows for the surge."""
        curve, rep = self.curve(), self.replica
        top = max(curve.peak_over(self.replay_start, self.measured_end), curve.peak_rps)
        static = replicas_for(curve.peak_rps if self.ramp else top, rep, p95_wait=self.slo_ms / 2000)
        return {
            "static": static,
            "min": replicas_for(self.night_rps, rep, p95_wait=self.slo_ms / 2000),
            "max": math.ceil(top / (self.capacity_rps * self.target_utilization)) + 2,
        }


# ---- specs (pure) ------------------------------------------------------------------------------------
def base_spec(prometheus: str, annotations: dict[str, str]) -> dict[str, Any]:
    """What every configuration shares: the model, one H100 per replica, the Prometheus to read."""
    return {
        "model": {"uri": "hf://org/tiny", "revision": "v1"},
        "resources": {"gpuProduct": GPU_PRODUCT, "gpusPerReplica": 1, "cpu": "1", "memory": "4Gi"},
        "analysis": {"prometheusAddress": prometheus},
        "podMetadata": {"annotations": annotations},
    }


def config_spec(kind: str, s: Settings, prometheus: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The spec of one configuration (the oracle starts at its first target)."""
    spec = base_spec(prometheus, annotations)
    sizes, loop = s.sizes(), s.loop
    if kind == "static":
        spec["scaling"] = {"replicas": sizes["static"]}
    elif kind == "oracle":
        spec["scaling"] = {"replicas": initial_replicas("oracle", s)}
    else:
        autoscale: dict[str, Any] = {
            "minReplicas": sizes["min"],
            "maxReplicas": sizes["max"],
            "targets": {"inFlightRequests": max(1, round(s.target_utilization * s.replica.slots))},
            "scaleDownStabilizationSeconds": loop["scale_down_stabilization_seconds"],
        }
        if kind in ("predictive", "slo", "surge"):
            autoscale["forecast"] = {
                "enabled": True,
                # usable capacity of one replica: at the same utilisation the in-flight target keeps
                "requestsPerReplica": round(s.capacity_rps * s.target_utilization, 3),
                "seasonalPeriodSeconds": int(s.day_seconds),
                "historySeconds": int(max(1, s.history_days) * s.day_seconds),
                "leadSeconds": int(s.load_seconds + loop["forecast_extra_lead_seconds"]),
                "maxOverProvisionPercent": 50,
                "intervalSeconds": loop["forecast_interval_seconds"],
                # scale-down follows the forecast (the floor guards), not the fixed window
                "scaleDown": "Forecast",
            }
            # the standbys: sized from the forecast's error (at least --warm-pool)
            autoscale["warmPool"] = {"replicas": s.warm_pool, "fromForecastError": True}
        if kind in ("slo", "surge"):
            # the bench's SLO is on the queue wait; the chat API's time to first token adds the replica's own
            autoscale["slo"] = {
                "timeToFirstTokenP95Milliseconds": round(s.slo_ms + s.replica.ttft_seconds * 1000),
                "breachSeconds": max(1, round(5 / s.loop_compression)),
            }
        if kind == "surge":
            autoscale["surge"] = {"factor": s.surge_factor, "withinSeconds": 10}
        # the autoscaler owns spec.scaling.replicas from here; it starts where the replay does
        spec["scaling"] = {"replicas": initial_replicas(kind, s), "autoscale": autoscale}
    return spec


def initial_replicas(kind: str, s: Settings) -> int:
    """Replicas a configuration starts with (what the bench waits for before demand begins): the autoscaled
    ones the demand where the replay starts needs (the night's in the compressed day; in the fair run the
    morning's, as if they had followed the night up), the oracle its own target there."""
    sizes = s.sizes()
    if kind == "static":
        return sizes["static"]
    if kind == "oracle":
        return oracle_target(s, s.curve(), s.replay_start)
    need = replicas_for(s.curve().rate(s.replay_start), s.replica, p95_wait=s.slo_ms / 2000)
    return min(sizes["max"], max(sizes["min"], need))


def oracle_target(s: Settings, curve: DayCurve, t: float) -> int:
    """Replicas the oracle asks for at curve time t: enough for the peak of [t, t + load + margin]."""
    lead = s.load_seconds + s.oracle_margin
    return replicas_for(curve.peak_over(t, t + lead), s.replica, p95_wait=s.slo_ms / 2000)


def crd_admits(crd: dict[str, Any]) -> dict[str, bool]:
    """Whether the installed CRD's schema has spec.scaling.autoscale.forecast, .warmPool, .slo and .surge."""
    out = {"forecast": False, "warmPool": False, "slo": False, "surge": False}
    for version in crd.get("spec", {}).get("versions", []):
        props = version.get("schema", {}).get("openAPIV3Schema", {}).get("properties", {})
        auto = (
            props.get("spec", {})
            .get("properties", {})
            .get("scaling", {})
            .get("properties", {})
            .get("autoscale", {})
            .get("properties", {})
        )
        for key in out:
            out[key] = out[key] or key in auto
    return out


# ---- summary (pure) ----------------------------------------------------------------------------------
def summarize(rows: list[dict[str, Any]], s: Settings, namespaces: dict[str, str]) -> dict[str, Any]:
    """Per configuration, from the simulator's per-second truth rows of the measured day."""
    start, end = s.measured_start, s.measured_end
    surge_start, surge_end = s.surge_window
    slo = s.slo_ms / 1000
    real = s.real_seconds_per_bench_second
    out: dict[str, Any] = {}
    for kind, ns in namespaces.items():
        day = [r for r in rows if r["namespace"] == ns and start <= r["t"] < end]
        if not day:
            continue
        dt = s.measured_seconds / len(day)  # one row per tick; robust to a missed tick
        over = sum(dt for r in day if r["wait_p95"] > slo)
        gpu_seconds = sum(r["gpus"] * dt for r in day)
        surge = [r for r in day if surge_start <= r["t"] < surge_end]
        rest = [r for r in day if not surge_start <= r["t"] < surge_end]
        out[kind] = {
            "seconds_over_slo": round(over, 1),
            "minutes_over_slo_real": round(over * real / 60, 1),
            "slo_attainment_percent": round(100 * (1 - over / s.measured_seconds), 2),
            "worst_p95_wait_seconds": round(max(r["wait_p95"] for r in day), 3),
            "worst_mean_wait_seconds": round(max(r["wait_mean"] for r in day), 3),
            "timed_out_requests": round(sum(r["timed_out"] for r in day)),
            "requests": round(sum(r["rate"] * dt for r in day)),
            "gpu_hours": round(gpu_seconds * real / 3600, 2),
            "mean_gpus": round(gpu_seconds / s.measured_seconds, 2),
            "max_pods": max(r["pods"] for r in day),
            "surge": window_figures(surge, slo),
            "outside_surge": window_figures(rest, slo),
        }
        if not s.ramp:
            out[kind]["day_minutes_over_slo"] = round(over / s.day_seconds * 1440, 1)
            out[kind]["gpu_hours_per_day"] = out[kind]["gpu_hours"]
    ratios(out)
    return out


def window_figures(rows: list[dict[str, Any]], slo: float) -> dict[str, Any]:
    """Seconds over the SLO, attainment and worst p95 wait of a stretch of one configuration's rows."""
    if not rows:
        return {}
    over = sum(1 for r in rows if r["wait_p95"] > slo)
    return {
        "seconds": len(rows),
        "seconds_over_slo": over,
        "slo_attainment_percent": round(100 * (1 - over / len(rows)), 2),
        "worst_p95_wait_seconds": round(max(r["wait_p95"] for r in rows), 3),
        "timed_out_requests": round(sum(r["timed_out"] for r in rows)),
    }


def history_openmetrics(curve: DayCurve, start: float, end: float, t0: float, namespaces: list[str]) -> str:
    """OpenMetrics text of each namespace's `chatfleet_requests_total{namespace, model}` counter over curve
    times [start, end), a sample every 15 s at wall time t0 + curve time (the day's curve, no surge).

    e.g. a flat 10 req/s curve over 60 s: values 0, 150, 300, 450 at t0+start, +15 s, +30 s, +45 s."""
    step = 15.0
    lines = ["# TYPE chatfleet_requests counter"]
    for ns in namespaces:
        total, t = 0.0, start
        while t < end:
            lines.append(
                f'chatfleet_requests_total{{namespace="{ns}",model="{NAME}"}} {total:.1f} {t0 + t:.3f}'
            )
            total += (curve.daily(t) + curve.daily(t + step)) / 2 * step
            t += step
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def steepest_hour(night: float, peak: float, day_seconds: float) -> float:
    """Curve time where the day's curve rises most in one hour (the morning ramp), to the minute.

    e.g. a 24 h day from 12 to 60 req/s -> about 5 h in (the rise is steepest before mid-morning)."""
    curve = DayCurve(night, peak, day_seconds)
    hour = min(3600.0, day_seconds / 24)
    starts = [m * 60.0 for m in range(int((day_seconds / 2 - hour) // 60) + 1)]
    return max(starts, key=lambda t: curve.daily(t + hour) - curve.daily(t))


def ratios(out: dict[str, Any]) -> None:
    """Add time-over-SLO vs reactive, GPU-hours vs static and oracle, attainment vs static to each entry,
    and the goal verdicts."""
    reactive, oracle, static = out.get("reactive"), out.get("oracle"), out.get("static")
    for entry in out.values():
        if reactive:
            base = reactive["seconds_over_slo"]
            entry["over_slo_vs_reactive"] = round(entry["seconds_over_slo"] / base, 3) if base else None
        if oracle and oracle["gpu_hours"]:
            entry["gpu_hours_vs_oracle"] = round(entry["gpu_hours"] / oracle["gpu_hours"], 3)
        if static and static["gpu_hours"]:
            entry["gpu_hours_vs_static"] = round(entry["gpu_hours"] / static["gpu_hours"], 3)
            entry["attainment_points_vs_static"] = round(
                entry["slo_attainment_percent"] - static["slo_attainment_percent"], 2
            )
        # the day goal: attainment within 1 point of static at <= 0.74x its GPU-hours, and
        # <= 1.15x the oracle's GPU-hours
        if static and oracle and entry is not static and entry is not oracle:
            entry["goal_day_met"] = (
                entry["attainment_points_vs_static"] >= -1.0
                and entry["gpu_hours_vs_static"] <= 0.74
                and entry["gpu_hours_vs_oracle"] <= 1.15
            )
    p = out.get("predictive")
    if p and reactive and oracle:
        base = reactive["seconds_over_slo"]
        p["goal_over_slo_met"] = p["seconds_over_slo"] <= 0.10 * base if base else p["seconds_over_slo"] == 0
        p["goal_gpu_hours_met"] = p["gpu_hours"] <= 1.15 * oracle["gpu_hours"]


# ---- the run -----------------------------------------------------------------------------------------
@dataclass
class Run:
    """The platform, KEDA, the operator, Prometheus, the fleet simulator; the oracle and sampler loops."""

    s: Settings
    cluster: Cluster = field(init=False)
    prom: services.Prometheus | None = None
    notes: dict[str, str] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    t0: float = 0.0

    def __post_init__(self) -> None:
        self.cluster = Cluster(REPO / ".work" / "bench-autoscale", progress=lambda m: None)
        self.namespaces = {k: f"as-{k}" for k in self.s.configs}
        self._stop = threading.Event()

    # platform
    def up(self) -> None:
        """Cluster (compressed HPA sync), CRD, KEDA when built, operator, Prometheus."""
        s = self.s
        say(f"starting the local platform ({s.nodes} kwok GPU nodes, HPA sync {s.loop['hpa_sync_seconds']}s)")
        self.cluster.up(nodes=s.nodes, hpa_sync_seconds=s.loop["hpa_sync_seconds"])
        self.cluster.install_crd(CHATBOT_CRD_FILE, CHATBOT_CRD_NAME)
        try:
            from chatfleet_platform.addons.keda import Keda

            Keda(self.cluster).up()
            self.notes["keda"] = (
                "KEDA operator and metrics adapter running (external.metrics.k8s.io Available)"
            )
        except PlatformError as exc:
            self.notes["keda"] = f"KEDA not running: {exc}"
        say(self.notes["keda"])
        self.cluster.start_extra(
            "operator", [sys.executable, "-m", "chatfleet_operator.cli", "run", *LOCAL_ANALYSIS_ARGS]
        )
        self.sim_port = procs.free_port()
        if s.ramp:
            self.backfill(self.cluster.workdir / "prometheus" / "data")
        self.prom = services.Prometheus(
            self.cluster.workdir / "prometheus",
            targets=[f"127.0.0.1:{self.sim_port}"],
            scrape_interval=f"{s.loop['scrape_seconds']}s",
        ).start()
        client = kubernetes.config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)

    def backfill(self, data: Path) -> None:
        """The forecast's history, written into a fresh TSDB before Prometheus starts (the fair run).

        Each forecasting fleet's request counter from the day's curve (no surge), a sample every 15 s,
        from `history_days` before the replay up to now, in curve time as the replay will continue it
        (self.t0, planned before the platform starts)."""
        import shutil

        s = self.s
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        now = time.time()
        start = s.replay_start - s.history_days * s.day_seconds
        kinds = [k for k in s.configs if k in ("predictive", "slo", "surge")]
        text = history_openmetrics(
            s.curve(), start, now - self.t0, self.t0, [self.namespaces[k] for k in kinds]
        )
        source = DATA / "history.om"
        source.write_text(text)
        say(
            f"writing {s.history_days} day(s) of request history for {', '.join(kinds)} into Prometheus' TSDB"
        )
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip

    def down(self) -> None:
        """Stop everything started here."""
        self._stop.set()
        if self.prom is not None:
            self.prom.stop()
        self.cluster.down()

    def available(self) -> dict[str, str]:
        """Configuration -> why it cannot run on this build ('' when it can)."""
        crd = json.loads(self.cluster.kubectl("get", "crd", CHATBOT_CRD_NAME, "-o", "json").stdout)
        admits = crd_admits(crd)
        missing = [
            f"spec.scaling.autoscale.{k}" for k, ok in admits.items() if not ok and k not in ("slo", "surge")
        ]
        why = {k: "" for k in self.s.configs}
        if "predictive" in why and missing:
            why["predictive"] = f"not available on this build: the CRD does not admit {', '.join(missing)}"
        for kind in ("slo", "surge"):
            if kind in why and not admits[kind]:
                why[kind] = (
                    f"not available on this build: the CRD does not admit spec.scaling.autoscale.{kind}"
                )
        return why

    def create(self, kinds: list[str], annotations: dict[str, str]) -> None:
        """A namespace and a ChatbotService per configuration."""
        assert self.prom is not None
        for kind in kinds:
            ns = self.namespaces[kind]
            self.cluster.kubectl("create", "namespace", ns, check=False)
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ChatbotService",
                "metadata": {"name": NAME, "namespace": ns},
                "spec": config_spec(kind, self.s, self.prom.url, annotations),
            }
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def ready_pods(self, ns: str) -> int:
        """Ready pods of the ChatbotService in ns."""
        pods = self.core.list_namespaced_pod(ns, label_selector=f"chatfleet.io/service={NAME}").items
        return sum(
            1
            for p in pods
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        )

    def start_sim(self, kinds: list[str], load_in_sim: float) -> None:
        """The fleet simulator as a cluster extra (stopped with the cluster), config in DATA."""
        rep = replace(self.s.replica, load_seconds=load_in_sim)
        cfg = {
            "t0": self.t0,
            "until": self.t0 + self.s.measured_end + 30,
            "kubeconfig": str(self.cluster.kubeconfig),
            "truth": str(DATA / "truth.jsonl"),
            "port": self.sim_port,
            "seed": self.s.seed,
            "tick": 1.0,
            "services": [
                {
                    "namespace": self.namespaces[k],
                    "name": NAME,
                    "curve": self.s.curve().to_json(),
                    "replica": asdict(rep),
                }
                for k in kinds
            ],
        }
        path = DATA / "fleetsim.json"
        path.write_text(json.dumps(cfg, indent=2))
        env = {**self.cluster.env}
        env["PYTHONPATH"] = ":".join(p for p in (str(REPO / "hack"), env.get("PYTHONPATH", "")) if p)
        self.cluster.start_extra(
            "fleetsim",
            [sys.executable, "-m", "chatfleet_platform.load.fleetsim", "--config", str(path)],
            env=env,
        )

    # loops
    def oracle_loop(self) -> None:
        """Set the oracle's spec.scaling.replicas ahead of demand, once a second."""
        ns, curve, last = self.namespaces["oracle"], self.s.curve(), None
        while not self._stop.wait(1.0):
            want = oracle_target(self.s, curve, time.time() - self.t0)
            if want != last:
                try:
                    patch = {"spec": {"scaling": {"replicas": want}}}
                    self.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME, patch)
                    last = want
                except kubernetes.client.ApiException as exc:
                    say(f"oracle: patch failed ({exc.status}); retrying")

    def sample_loop(self, every: float = 2.0) -> None:
        """Record each ChatbotService's desired replicas and autoscaling status every `every` seconds."""
        while not self._stop.wait(every):
            try:
                items = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
            except Exception:  # a hiccup: skip one sample
                continue
            t = round(time.time() - self.t0, 1)
            for item in items:
                st = item.get("status") or {}
                self.samples.append(
                    {
                        "t": t,
                        "namespace": item["metadata"]["namespace"],
                        "replicas": (item["spec"].get("scaling") or {}).get("replicas"),
                        "desired": st.get("desiredReplicas"),
                        "autoscaling": st.get("autoscaling"),
                    }
                )

    def autoscaler_report(self, ns: str) -> dict[str, Any]:
        """What drove an autoscaled configuration: KEDA ScaledObject, the HPA's metrics and conditions."""
        out: dict[str, Any] = {}
        res = self.cluster.kubectl("get", "scaledobjects", "-o", "json", namespace=ns, check=False)
        out["scaledobjects"] = (
            [i["metadata"]["name"] for i in json.loads(res.stdout)["items"]] if res.returncode == 0 else []
        )
        res = self.cluster.kubectl("get", "hpa", "-o", "json", namespace=ns, check=False)
        hpas = json.loads(res.stdout)["items"] if res.returncode == 0 else []
        out["hpas"] = [
            {
                "name": h["metadata"]["name"],
                "metrics": [m.get("type") for m in h["spec"].get("metrics") or []],
                "currentMetrics": (h.get("status") or {}).get("currentMetrics"),
                "conditions": {
                    c["type"]: f"{c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                    for c in (h.get("status") or {}).get("conditions") or []
                },
            }
            for h in hpas
        ]
        mine = [x for x in self.samples if x["namespace"] == ns and x["replicas"] is not None]
        out["replicas_min_max"] = (
            [min(x["replicas"] for x in mine), max(x["replicas"] for x in mine)] if mine else []
        )
        last = next((x["autoscaling"] for x in reversed(mine) if x.get("autoscaling")), None)
        out["last_status_autoscaling"] = last
        return out


def main(argv: list[str] | None = None) -> int:
    """Run the day; print the table; write bench-results/autoscale.json and .png."""
    s = parse(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    for stale in ("truth.jsonl", "fleetsim.json"):
        (DATA / stale).unlink(missing_ok=True)
    run = Run(s)
    # the fair run plans the wall time of curve 0 now, so the history written into Prometheus and the
    # replay are one timeline (the fleets have about SETUP_SECONDS to start); else it is set below
    run.t0 = time.time() + SETUP_SECONDS - s.replay_start
    result: dict[str, Any] = {
        "settings": {
            **asdict(s),
            "loop": s.loop,
            "sizes": s.sizes(),
            "measured": [s.measured_start, s.measured_end],
            "surge_window": list(s.surge_window),
        }
    }
    annotation = kwok_load_annotation(STAGES_FILE.read_text())
    annotations = {annotation: f"{int(s.load_seconds)}s"} if annotation else {}
    load_in_sim = 0.0 if annotation else s.load_seconds
    result["model_load"] = (
        f"kwok delays Ready by {int(s.load_seconds)}s (pod annotation {annotation})"
        if annotation
        else f"simulated: a pod serves {int(s.load_seconds)}s after Ready (no kwok load-delay stage on this build)"
    )
    try:
        run.up()
        why = run.available()
        kinds = [k for k in s.configs if not why[k]]
        result["not_available"] = {k: v for k, v in why.items() if v}
        for k, v in result["not_available"].items():
            say(f"{k}: {v}")
        run.create(kinds, annotations)
        say(f"created {', '.join(kinds)}; waiting for their first pods")
        deadline = time.monotonic() + 180
        first = {k: initial_replicas(k, s) for k in kinds}
        while time.monotonic() < deadline and not all(
            run.ready_pods(run.namespaces[k]) >= first[k] for k in kinds
        ):
            time.sleep(1)
        if s.ramp:  # the replay starts where the plan put it, or now when the platform took longer
            late = time.time() - (run.t0 + s.replay_start)
            if late < 0:
                time.sleep(-late)
            else:
                say(f"the platform took {late:.0f}s longer than planned: the lead-in is that much shorter")
        else:
            run.t0 = time.time() + load_in_sim + 3  # the first pods have loaded when demand begins
        run.start_sim(kinds, load_in_sim)
        threads = [threading.Thread(target=run.sample_loop, daemon=True)]
        if "oracle" in kinds:
            threads.append(threading.Thread(target=run.oracle_loop, daemon=True))
        for th in threads:
            th.start()
        if s.ramp:
            say(
                f"replaying the morning ramp uncompressed: a {s.lead_in_seconds:.0f}s lead-in, then the hour "
                f"from {s.measured_start / 3600:.2f} h ({s.run_seconds / 60:.1f} min); surge x{s.surge_factor:g} "
                f"{s.surge_into_slice:.0f}s into the hour"
            )
        else:
            say(
                f"replaying {s.history_days} history day(s) + 1 measured day of {s.day_seconds:.0f}s "
                f"({s.run_seconds / 60:.1f} min); surge x{s.surge_factor:g} at {s.surge_at:.0%} of the measured day"
            )
        end = run.t0 + s.measured_end + 2
        while time.time() < end:
            time.sleep(min(30, max(0.0, end - time.time())))
            progress(run, s)
        run._stop.set()
        result["autoscalers"] = {
            k: run.autoscaler_report(run.namespaces[k])
            for k in kinds
            if k in ("reactive", "predictive", "slo", "surge")
        }
        result["notes"] = run.notes
    finally:
        run.down()
    rows = read_truth(DATA / "truth.jsonl")
    result["results"] = summarize(rows, s, {k: run.namespaces[k] for k in s.configs})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "autoscale.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "autoscale-timeline.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows if s.measured_start <= r["t"] < s.measured_end)
    )
    plot(rows, run.samples, s, run.namespaces, RESULTS / "autoscale.png")
    print_table(result, s)
    return 0


def parse(argv: list[str] | None) -> Settings:
    """Flags -> Settings (--smoke: a 3-minute day, no history)."""
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--day-seconds", type=float, default=d.day_seconds, help="one compressed day (360 s: 240x)"
    )
    p.add_argument(
        "--history-days", type=int, default=d.history_days, help="days replayed before the measured one"
    )
    p.add_argument(
        "--loop-compression",
        type=float,
        default=d.loop_compression,
        help="control loops run this much faster",
    )
    p.add_argument("--load-seconds", type=float, default=d.load_seconds, help="model-load time of a replica")
    p.add_argument("--slo-ms", type=float, default=d.slo_ms, help="p95 queue-wait SLO")
    p.add_argument("--warm-pool", type=int, default=d.warm_pool)
    p.add_argument("--configs", default=",".join(d.configs), help=f"subset of {','.join(CONFIGS)}")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a 3-minute day, no history (with --ramp: a 5-minute slice; shows the harness works)",
    )
    p.add_argument(
        "--ramp",
        action="store_true",
        help="the fair run: nothing compressed, one hour of the morning ramp measured (~75 min)",
    )
    p.add_argument("--lead-in-seconds", type=float, default=d.lead_in_seconds)
    p.add_argument("--slice-seconds", type=float, default=d.slice_seconds)
    p.add_argument("--surge-into-slice", type=float, default=d.surge_into_slice)
    a = p.parse_args(argv)
    s = replace(
        d,
        day_seconds=a.day_seconds,
        history_days=a.history_days,
        loop_compression=a.loop_compression,
        load_seconds=a.load_seconds,
        slo_ms=a.slo_ms,
        warm_pool=a.warm_pool,
        configs=tuple(c for c in CONFIGS if c in a.configs.split(",")),
        lead_in_seconds=a.lead_in_seconds,
        slice_seconds=a.slice_seconds,
        surge_into_slice=a.surge_into_slice,
    )
    if a.ramp:
        s = replace(s, ramp=True, day_seconds=86400.0, loop_compression=1.0)
        if a.smoke:
            s = replace(s, slice_seconds=300.0, lead_in_seconds=120.0, surge_into_slice=60.0, surge_hold=30.0)
    elif a.smoke:
        s = replace(s, day_seconds=180.0, history_days=0, surge_hold=30.0)
    # GPUs for every row at its maxReplicas at once: a row that waits for a GPU another row holds would
    # measure the machine, not its autoscaler (kwok nodes of 4 GPUs)
    return replace(s, nodes=max(s.nodes, math.ceil(len(s.configs) * s.sizes()["max"] / 4) + 2))


def read_truth(path: Path) -> list[dict[str, Any]]:
    """The simulator's per-second rows ([] when it never ran)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def progress(run: Run, s: Settings) -> None:
    """One line: curve time and, per configuration, serving/pods and the last p95 wait."""
    rows = read_truth(DATA / "truth.jsonl")
    last: dict[str, dict[str, Any]] = {}
    for r in rows:
        last[r["namespace"]] = r
    parts = []
    for kind, ns in run.namespaces.items():
        r = last.get(ns)
        if r:
            parts.append(f"{kind} {r['serving']}/{r['pods']} p95 {r['wait_p95']:.2f}s")
    t = time.time() - run.t0
    day = "history" if t < s.measured_start else "measured"
    say(f"t={t:5.0f}s ({day}) rate {rows[-1]['rate'] if rows else 0:.0f} rps | " + " | ".join(parts))


# ---- output ------------------------------------------------------------------------------------------
def plot(rows: list[dict[str, Any]], samples, s: Settings, namespaces: dict[str, str], out: Path) -> None:
    """Demand, replicas (serving and holding GPUs) and p95 queue wait over the measured day, per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, length = s.measured_start, s.measured_seconds
    hours = 24 / s.day_seconds
    fig, (ax_rate, ax_rep, ax_wait) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    colors = {
        "static": "tab:gray",
        "reactive": "tab:red",
        "predictive": "tab:green",
        "slo": "tab:orange",
        "surge": "tab:purple",
        "oracle": "tab:blue",
    }
    curve, rep = s.curve(), s.replica
    ts = [start + i for i in range(int(length))]
    ax_rate.plot([(t - start) * hours for t in ts], [curve.rate(t) for t in ts], color="black")
    ax_rate.set_ylabel("demand (requests/s)")
    ax_rep.plot(
        [(t - start) * hours for t in ts],
        [replicas_for(curve.rate(t), rep, p95_wait=s.slo_ms / 2000) for t in ts],
        color="black",
        linestyle=":",
        label="needed now",
    )
    for kind, ns in namespaces.items():
        day = [r for r in rows if r["namespace"] == ns and start <= r["t"] < start + length]
        if not day:
            continue
        x = [(r["t"] - start) * hours for r in day]
        c = colors[kind]
        ax_rep.plot(x, [r["serving"] for r in day], color=c, label=f"{kind} serving")
        ax_rep.plot(
            x, [r["pods"] for r in day], color=c, linestyle="--", linewidth=0.8, label=f"{kind} GPUs held"
        )
        ax_wait.plot(x, [max(r["wait_p95"], 1e-3) for r in day], color=c, label=kind)
    ax_rep.set_ylabel("replicas")
    ax_rep.legend(fontsize=7, ncol=3, loc="upper right")
    ax_wait.axhline(s.slo_ms / 1000, color="black", linestyle=":", label="SLO")
    ax_wait.set_yscale("log")
    ax_wait.set_ylabel("p95 queue wait (s)")
    ax_wait.set_xlabel(
        f"hours since {start / 3600:.2f} h of the day (uncompressed)"
        if s.ramp
        else f"hour of the measured day (1 h = {s.day_seconds / 24:.0f} s)"
    )
    ax_wait.legend(fontsize=7, ncol=5, loc="upper right")
    fig.suptitle(
        (
            "make bench-autoscale-ramp (uncompressed hour of the morning ramp)"
            if s.ramp
            else "make bench-autoscale"
        )
        + ": static, reactive, forecast + warm pool, + SLO, + surge pool, oracle"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def print_table(result: dict[str, Any], s: Settings) -> None:
    """Per configuration: time over SLO, worst wait, GPU-hours, ratios; then the goals."""
    res, na = result["results"], result.get("not_available", {})
    head = (
        "config",
        "SLO attainment" if s.ramp else "over SLO (min/day)",
        "worst p95 wait",
        "GPU-h (the hour)" if s.ramp else "GPU-h/day",
        "vs static",
        "vs oracle",
        "over SLO vs reactive",
        "surge: attainment / worst p95",
        "outside the surge",
    )
    rows = [head]
    for kind in s.configs:
        if kind in na:
            rows.append((kind, "not available on this build (below)", *[""] * (len(head) - 2)))
            continue
        r = res.get(kind)
        if not r:
            rows.append((kind, "no data", *[""] * (len(head) - 2)))
            continue
        vs_r, vs_o, vs_s = (
            r.get(k) for k in ("over_slo_vs_reactive", "gpu_hours_vs_oracle", "gpu_hours_vs_static")
        )
        surge, rest = r.get("surge") or {}, r.get("outside_surge") or {}
        rows.append(
            (
                kind,
                f"{r['slo_attainment_percent']:.2f} %"
                if s.ramp
                else f"{r['day_minutes_over_slo']:.0f} ({r['seconds_over_slo']:.0f}s)",
                f"{r['worst_p95_wait_seconds']:.2f}s",
                f"{r['gpu_hours']:.1f}" if s.ramp else f"{r['gpu_hours']:.0f}",
                "-" if vs_s is None else f"{vs_s:.2f}x",
                "-" if vs_o is None else f"{vs_o:.2f}x",
                "-" if vs_r is None else f"{vs_r:.2f}x",
                f"{surge.get('slo_attainment_percent', 0):.1f} % / {surge.get('worst_p95_wait_seconds', 0):.2f}s"
                if surge
                else "-",
                f"{rest.get('slo_attainment_percent', 0):.2f} %" if rest else "-",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)))
    p = res.get("predictive")
    goal_1 = (
        "n/a" if not p or "goal_over_slo_met" not in p else ("met" if p["goal_over_slo_met"] else "MISSED")
    )
    goal_2 = (
        "n/a" if not p or "goal_gpu_hours_met" not in p else ("met" if p["goal_gpu_hours_met"] else "MISSED")
    )
    for kind in ("reactive", "predictive", "slo", "surge"):
        r = res.get(kind) or {}
        if "goal_day_met" in r:
            print(
                f"goal ({kind}): attainment within 1 point of static's ({r['attainment_points_vs_static']:+.2f}) at "
                f"<= 0.74x its GPU-hours ({r['gpu_hours_vs_static']:.2f}x) and <= 1.15x the oracle's "
                f"({r['gpu_hours_vs_oracle']:.2f}x): {'met' if r['goal_day_met'] else 'MISSED'}"
            )
    print(f"goal: predictive time over SLO <= 10 % of reactive's: {goal_1}")
    print(f"goal: predictive GPU-hours <= 1.15x oracle's: {goal_2}")
    print(f"SLO: p95 queue wait <= {s.slo_ms:.0f} ms; model load: {result['model_load']}")
    for kind, why in na.items():
        print(f"{kind}: {why}")
    for kind, rep in (result.get("autoscalers") or {}).items():
        srcs = "KEDA ScaledObject" if rep["scaledobjects"] else "HPA (no ScaledObject)"
        active = next((h["conditions"].get("ScalingActive", "") for h in rep["hpas"]), "no HPA")
        print(f"{kind}: {srcs}; replicas {rep['replicas_min_max']}; ScalingActive: {active}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as e:
        print(f"bench failed: {e}", file=sys.stderr)
        sys.exit(1)
