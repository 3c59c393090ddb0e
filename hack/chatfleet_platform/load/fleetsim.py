"""A simulated chat fleet for kwok pods: demand over time, a queue model per ChatbotService, runtime metrics.

kwok pods run no containers, so the autoscaling benchmark needs something that behaves like a fleet of
chat replicas: requests arrive at a rate that follows a curve, the Ready replicas that serve take them at
a fixed capacity, the rest waits. One exporter process (127.0.0.1) serves the runtime's own metric
families per pod, scraped by the platform's real Prometheus, so the autoscaler (KEDA, the HPA controller,
the operator's forecast) sees what it would see in production; it also writes the ground truth (the
queue wait of every second) for the report.

The pure parts (tested in tests/unit/platform/test_fleetsim.py):

- `DayCurve`: requests/s over time, a compressed day (night -> peak and back, a raised cosine) repeated,
  plus optional sudden surges (x factor within `rise` seconds, held, then back).
- `Replica`: one replica's capacity (requests/s at saturation), the time it serves one request, the time
  to first token once admitted, and its model-load time.
- The queue model (`QueueModel.step`), per ChatbotService, one step per tick. Requests are served in
  parallel "slots": a replica of capacity mu requests/s that takes S seconds per request holds mu * S
  requests at once (continuous batching). Two parts, added:
    * a fluid backlog Q for overload (arrival rate above capacity): Q' = max(0, Q + (lambda - cap) dt);
      its wait is Q / cap (cap = at least one replica's capacity, so a fleet with no capacity shows the
      wait a request would see if one replica came up now). Requests that would wait past `timeout` are
      dropped and counted as timed out (the chat API gives up after its timeout too).
    * the stationary M/M/m wait at the offered load (m = slots over the serving replicas, utilisation
      capped at 0.95 so it stays finite; beyond it the fluid backlog carries the overload, and the
      stationary queue, which would take long to build, is not assumed to be there in full): Erlang C
      gives the chance to wait, the wait beyond is exponential with rate cap - lambda, so its p95 is
      ln(C / 0.05) / (cap - lambda).
  wait = fluid wait + stationary wait; per-request observations draw the stationary part from that
  distribution with a seeded random generator (deterministic for the same inputs).
- `replicas_for`: the fewest replicas that keep utilisation and the p95 wait under bounds (how the static
  fleet and the oracle are sized).

Which pods serve: Ready, not deleting, and not labelled chatfleet.io/serving="false" (a warm pool's
standby pods), and loaded: `load_seconds` after Ready when the simulator stands in for model loading;
0 when the kwok stages delay readiness themselves (a pod annotation, see `kwok_load_annotation`).

CLI: python -m chatfleet_platform.load.fleetsim --config fleetsim.json  (written by bench/autoscale_bench.py)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

#: The chat API's latency buckets (runtime/chatfleet_runtime/chat/metrics.py), so quantiles match production.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
LABEL_SERVICE = "chatfleet.io/service"
LABEL_TRACK = "chatfleet.io/track"
LABEL_SERVING = "chatfleet.io/serving"
GPU_RESOURCE = "nvidia.com/gpu"
#: Utilisation the stationary part is capped at (beyond it the fluid backlog carries the overload).
RHO_MAX = 0.95


# ---- demand ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Surge:
    """A sudden surge: demand reaches `factor` x the level it had at `at` within `rise` s, held `hold` s.

    Additive: the extra demand, (factor - 1) x the daily rate at `at`, rides on the daily curve.
    """

    at: float
    factor: float = 5.0
    rise: float = 10.0
    hold: float = 60.0

    def ramp(self, t: float) -> float:
        """Share of the surge at t, e.g. at=100, rise 10, hold 60: t=95 -> 0, 105 -> 0.5, 120 -> 1, 175 -> 0.5."""
        up = (t - self.at) / self.rise
        down = (t - self.at - self.rise - self.hold) / self.rise
        return min(1.0, max(0.0, up)) - min(1.0, max(0.0, down))


@dataclass(frozen=True)
class DayCurve:
    """Requests/s over time: a compressed day repeated (night at 0, peak at half a day) plus surges.

    daily(t) = night + (peak - night) * ((1 - cos(2 pi t / day)) / 2) ** shape; rate(t) = daily(t) plus,
    per surge, (factor - 1) * daily(at) * ramp(t); 0 before t=0.
    e.g. night 12, peak 60, day 360: t=0 -> 12, t=180 -> 60, t=360 -> 12.
    """

    night_rps: float
    peak_rps: float
    day_seconds: float
    shape: float = 1.5
    surges: tuple[Surge, ...] = ()

    def daily(self, t: float) -> float:
        """The daily curve alone (no surge) at t >= 0."""
        phase = (1 - math.cos(2 * math.pi * t / self.day_seconds)) / 2
        return self.night_rps + (self.peak_rps - self.night_rps) * phase**self.shape

    def rate(self, t: float) -> float:
        """Requests/s at t seconds after the start."""
        if t < 0:
            return 0.0
        extra = sum((s.factor - 1) * self.daily(s.at) * s.ramp(t) for s in self.surges)
        return self.daily(t) + extra

    def peak_over(self, start: float, end: float, step: float = 1.0) -> float:
        """Highest rate over [start, end], sampled every `step` s (and at both ends and surge corners)."""
        points = [start, end, *(start + i * step for i in range(int((end - start) / step) + 1))]
        for s in self.surges:
            points += [s.at + s.rise, s.at + s.rise + s.hold]
        return max(self.rate(t) for t in points if start <= t <= end)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (from_json reads it back)."""
        return {**asdict(self), "surges": [asdict(s) for s in self.surges]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DayCurve:
        """Read to_json's form."""
        return cls(**{**d, "surges": tuple(Surge(**s) for s in d.get("surges") or ())})


# ---- one replica and the queue -----------------------------------------------------------------------
@dataclass(frozen=True)
class Replica:
    """One simulated chat replica."""

    capacity_rps: float = 10.0
    """Requests/s it completes at saturation (continuous batching included)."""
    service_seconds: float = 2.0
    """Time it takes to serve one admitted request (the whole response)."""
    ttft_seconds: float = 0.15
    """First token after admission (prefill)."""
    load_seconds: float = 40.0
    """Model-load time: how long after Ready it starts taking traffic (0 when kwok delays Ready itself)."""

    @property
    def slots(self) -> int:
        """Requests it holds at once: capacity x service time, e.g. 10 rps x 2 s -> 20."""
        return max(1, round(self.capacity_rps * self.service_seconds))


def erlang_c(servers: int, offered: float) -> float:
    """Chance an arrival waits in M/M/m (m=servers, offered load a = lambda x S), e.g. m=2, a=1 -> 1/3."""
    if servers <= 0 or offered >= servers:
        return 1.0
    if offered <= 0:
        return 0.0
    b = 1.0  # Erlang B by the stable recursion B(n) = a B(n-1) / (n + a B(n-1))
    for n in range(1, servers + 1):
        b = offered * b / (n + offered * b)
    rho = offered / servers
    return b / (1 - rho * (1 - b))


def stationary_wait(
    rate: float, replicas: int, replica: Replica, quantile: float = 0.95
) -> tuple[float, float]:
    """(mean, quantile) queue wait in seconds of M/M/m at `rate`, utilisation capped at RHO_MAX.

    e.g. 2 replicas of 1 slot (1 rps, S=1 s) at 1 rps: C = 1/3, mean = C / (cap - rate) = 1/3 s,
    p95 = ln(C / 0.05) / (cap - rate) = 1.90 s.
    """
    if replicas <= 0 or rate <= 0:
        return 0.0, 0.0
    servers = replicas * replica.slots
    cap = servers / replica.service_seconds
    lam = min(rate, RHO_MAX * cap)
    c = erlang_c(servers, lam * replica.service_seconds)
    gap = cap - lam
    mean = c / gap
    tail = 1 - quantile
    q = math.log(c / tail) / gap if c > tail else 0.0
    return mean, q


def replicas_for(
    rate: float, replica: Replica, *, max_utilization: float = 0.85, p95_wait: float = 0.15, limit: int = 1000
) -> int:
    """Fewest replicas (>= 1) with utilisation <= max_utilization and stationary p95 wait <= p95_wait.

    e.g. 60 rps of 10-rps replicas at <= 85 %: 60 / 8.5 -> 8 replicas.
    """
    for n in range(1, limit + 1):
        if (
            rate <= max_utilization * n * replica.capacity_rps
            and stationary_wait(rate, n, replica)[1] <= p95_wait
        ):
            return n
    return limit


@dataclass
class Step:
    """What one tick of the queue model produced (totals over the serving replicas)."""

    arrived: float
    admitted: float
    timed_out: float
    backlog: float
    wait_mean: float
    wait_p95: float
    inflight: float
    wait_chance: float
    """Chance an admitted request waits in the stationary part (Erlang C)."""
    drain_rate: float
    """Rate of the stationary wait's exponential tail (cap - lambda), 1/s."""
    fluid_wait: float


@dataclass
class QueueModel:
    """The fluid + M/M/m queue of one ChatbotService (see the module docstring)."""

    replica: Replica
    timeout: float = 60.0
    backlog: float = 0.0

    def step(self, rate: float, serving: int, dt: float) -> Step:
        """Advance dt seconds at `rate` requests/s with `serving` replicas taking traffic.

        e.g. 2 replicas of 10 rps, 30 rps for 1 s from empty: backlog 10, fluid wait 10 / 20 = 0.5 s.
        """
        rep = self.replica
        cap = serving * rep.capacity_rps
        arrived = rate * dt
        before = self.backlog
        self.backlog = max(0.0, before + arrived - cap * dt)
        admitted = before + arrived - self.backlog
        drain = max(cap, rep.capacity_rps)
        timed_out = max(0.0, self.backlog - self.timeout * drain)
        self.backlog -= timed_out
        fluid = self.backlog / drain
        mean, p95 = stationary_wait(rate, serving, rep)
        if serving > 0 and rate > 0:
            servers = serving * rep.slots
            lam = min(rate, RHO_MAX * cap)
            chance, gap = erlang_c(servers, lam * rep.service_seconds), cap - lam
        else:
            chance, gap = 0.0, 1.0
        served_rate = admitted / dt if dt > 0 else 0.0
        inflight = served_rate * rep.service_seconds + rate * mean + self.backlog
        return Step(
            arrived=arrived,
            admitted=admitted,
            timed_out=timed_out,
            backlog=self.backlog,
            wait_mean=fluid + mean,
            wait_p95=fluid + p95,
            inflight=inflight,
            wait_chance=chance,
            drain_rate=gap,
            fluid_wait=fluid,
        )


def split_counts(total: float, carry: float, pods: int) -> tuple[list[int], float]:
    """Whole requests per pod from a fractional total (the fraction carried), e.g. 7.5 over 2 -> [4, 3], 0.5."""
    whole = total + carry
    n = int(whole)
    if pods <= 0:
        return [], whole - n
    base, extra = divmod(n, pods)
    return [base + (1 if i < extra else 0) for i in range(pods)], whole - n


# ---- pods -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodView:
    """What the simulator needs to know of one pod."""

    name: str
    track: str
    bound: bool
    """Scheduled to a node and not finished: it holds its GPUs."""
    gpus: int
    ready_since: float | None
    """Epoch seconds the pod became Ready (None while not Ready or deleting)."""
    serving_label: str | None


def pod_view(pod: dict[str, Any]) -> PodView:
    """A PodView from a pod as the API returns it (JSON form)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    gpus = 0
    for c in spec.get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        gpus += int(limits.get(GPU_RESOURCE, 0) or 0)
    deleting = bool(meta.get("deletionTimestamp"))
    finished = status.get("phase") in ("Succeeded", "Failed")
    ready_since = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True" and not deleting:
            ready_since = _epoch(cond.get("lastTransitionTime"))
    return PodView(
        name=meta["name"],
        track=labels.get(LABEL_TRACK, "stable"),
        bound=bool(spec.get("nodeName")) and not finished and not deleting,
        gpus=gpus,
        ready_since=ready_since,
        serving_label=labels.get(LABEL_SERVING),
    )


def serving_pods(pods: Iterable[PodView], now: float, load_seconds: float) -> list[PodView]:
    """Pods taking traffic: Ready, not labelled serving=false, loaded (load_seconds after Ready)."""
    return sorted(
        (
            p
            for p in pods
            if p.ready_since is not None
            and p.serving_label != "false"
            and now - p.ready_since >= load_seconds
        ),
        key=lambda p: p.name,
    )


def _epoch(stamp: str | None) -> float | None:
    """RFC 3339 (the API's 2024-05-01T10:00:00Z) -> epoch seconds."""
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def kwok_load_annotation(stages_yaml: str) -> str | None:
    """The pod annotation a kwok Stage reads its readiness delay from, or None when the stages have none.

    Looks for a Pod stage whose `delay.durationFrom` expression (kwok v0.7's `jq.expression`, or the
    older `expressionFrom`) names `.metadata.annotations["KEY"]` and returns KEY (the value is a Go
    duration such as "40s").
    """
    for doc in yaml.safe_load_all(stages_yaml):
        spec = (doc or {}).get("spec") or {}
        if (spec.get("resourceRef") or {}).get("kind") != "Pod":
            continue
        source = (spec.get("delay") or {}).get("durationFrom") or {}
        expr = source.get("expressionFrom") or (source.get("jq") or {}).get("expression") or ""
        if ".metadata.annotations[" in expr:
            return expr.split("[", 1)[1].rstrip("]").strip("\"'")
    return None


# ---- the running simulator ---------------------------------------------------------------------------
@dataclass
class ServiceSim:
    """One ChatbotService's simulated fleet."""

    namespace: str
    name: str
    curve: DayCurve
    replica: Replica
    seed: int = 7
    model: QueueModel = field(init=False)
    rng: random.Random = field(init=False)
    carry: float = 0.0
    timed_out_carry: float = 0.0

    def __post_init__(self) -> None:
        self.model = QueueModel(self.replica)
        self.rng = random.Random(f"{self.seed}/{self.namespace}/{self.name}")


class FleetSim:
    """The exporter process: per tick, read pods, step every service's queue, update metrics and truth."""

    def __init__(
        self,
        services: Sequence[ServiceSim],
        *,
        t0: float,
        kubeconfig: Path,
        truth: Path,
        port: int,
        tick: float = 1.0,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.services, self.t0, self.tick = list(services), t0, tick
        self.kubeconfig, self.truth, self.port = kubeconfig, truth, port
        r = self.registry = CollectorRegistry()
        pod_labels = ["namespace", "model", "pod", "track"]
        self.requests = Counter(
            "chatfleet_requests",
            "Chat completion requests",
            [*pod_labels, "outcome", "code", "stream"],
            registry=r,
        )
        self.inflight = Gauge(
            "chatfleet_inflight_requests", "Requests being served or queued", pod_labels, registry=r
        )
        self.ttft = Histogram(
            "chatfleet_time_to_first_token_seconds",
            "From request arrival to the first generated token",
            [*pod_labels, "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "chatfleet_request_duration_seconds",
            "Whole response time of chat completions",
            [*pod_labels, "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        svc_labels = ["namespace", "model"]
        self.truth_wait = Gauge(
            "chatfleetsim_queue_wait_p95_seconds",
            "Ground truth: p95 queue wait this tick",
            svc_labels,
            registry=r,
        )
        self.truth_rate = Gauge(
            "chatfleetsim_arrival_rate", "Ground truth: requests/s arriving", svc_labels, registry=r
        )
        self.truth_serving = Gauge(
            "chatfleetsim_serving_replicas", "Ground truth: replicas taking traffic", svc_labels, registry=r
        )
        self._series: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    def list_pods(self) -> list[dict[str, Any]]:
        """All pods of ChatbotServices (one API list; JSON form)."""
        import kubernetes

        if not hasattr(self, "_api"):
            client = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
            self._api = kubernetes.client.CoreV1Api(client)
        resp = self._api.list_pod_for_all_namespaces(
            label_selector=LABEL_SERVICE, _preload_content=False, _request_timeout=5
        )
        return json.loads(resp.data)["items"]

    def tick_once(self, now: float, pods: list[dict[str, Any]], out) -> None:
        """One step of every service; one truth line per service to `out`."""
        t = now - self.t0
        for svc in self.services:
            views = [
                pod_view(p)
                for p in pods
                if p["metadata"]["namespace"] == svc.namespace
                and (p["metadata"].get("labels") or {}).get(LABEL_SERVICE) == svc.name
            ]
            serving = serving_pods(views, now, svc.replica.load_seconds)
            rate = svc.curve.rate(t)
            step = svc.model.step(rate, len(serving), self.tick)
            with self._lock:
                self._export(svc, serving, step)
            line = {
                "t": round(t, 3),
                "namespace": svc.namespace,
                "name": svc.name,
                "rate": round(rate, 3),
                "pods": sum(1 for v in views if v.bound),
                "gpus": sum(v.gpus for v in views if v.bound),
                "ready": sum(1 for v in views if v.ready_since is not None),
                "serving": len(serving),
                "backlog": round(step.backlog, 3),
                "wait_mean": round(step.wait_mean, 4),
                "wait_p95": round(step.wait_p95, 4),
                "timed_out": round(step.timed_out, 3),
            }
            out.write(json.dumps(line) + "\n")

    def _export(self, svc: ServiceSim, serving: list[PodView], step: Step) -> None:
        """Per-pod runtime metrics (requests split evenly over the serving pods) and the truth gauges."""
        ns, model = svc.namespace, svc.name
        keys = {(p.name, p.track) for p in serving}
        for name, track in self._series.get((ns, model), set()) - keys:  # pods gone or no longer serving
            for metric, extra in (
                (self.inflight, ()),
                (self.ttft, ("true",)),
                (self.duration, ("true",)),
                (self.requests, ("success", "200", "true")),
                (self.requests, ("error", "504", "true")),
            ):
                try:
                    metric.remove(ns, model, name, track, *extra)
                except KeyError:
                    pass
        self._series[(ns, model)] = keys
        counts, svc.carry = split_counts(step.admitted, svc.carry, len(serving))
        lost, svc.timed_out_carry = split_counts(step.timed_out, svc.timed_out_carry, len(serving))
        rep = svc.replica
        for i, pod in enumerate(serving):
            base = (ns, model, pod.name, pod.track)
            self.inflight.labels(*base).set(step.inflight / len(serving))
            ok = self.requests.labels(*base, "success", "200", "true")
            self.requests.labels(*base, "error", "504", "true").inc(lost[i])
            ttft, dur = self.ttft.labels(*base, "true"), self.duration.labels(*base, "true")
            for _ in range(counts[i]):
                wait = step.fluid_wait
                if svc.rng.random() < step.wait_chance:
                    wait += svc.rng.expovariate(step.drain_rate)
                jitter = svc.rng.uniform(0.9, 1.1)
                ok.inc()
                ttft.observe(wait + rep.ttft_seconds * jitter)
                dur.observe(wait + rep.service_seconds * jitter)
        self.truth_wait.labels(ns, model).set(step.wait_p95)
        self.truth_rate.labels(ns, model).set(step.arrived / self.tick)
        self.truth_serving.labels(ns, model).set(len(serving))

    def run(self, until: float | None = None) -> None:
        """Serve /metrics and tick until stopped (or until epoch `until`)."""
        self.serve()
        self.truth.parent.mkdir(parents=True, exist_ok=True)
        with self.truth.open("a") as out:
            next_at = time.time()
            while not self._stop.is_set() and (until is None or time.time() < until):
                now = time.time()
                try:
                    pods = self.list_pods()
                except Exception as exc:  # an API hiccup: keep the last tick's view out of it, say so
                    print(f"fleetsim: listing pods failed: {exc}", flush=True)
                    pods = getattr(self, "_last_pods", [])
                self._last_pods = pods
                self.tick_once(now, pods, out)
                out.flush()
                next_at += self.tick
                self._stop.wait(max(0.0, next_at - time.time()))

    def serve(self) -> None:
        """/metrics on 127.0.0.1:port (a thread)."""
        from prometheus_client import generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        sim = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                """Quiet."""

            def do_GET(self) -> None:
                """/metrics only."""
                if not self.path.startswith("/metrics"):
                    self.send_response(404)
                    self.end_headers()
                    return
                with sim._lock:
                    body = generate_latest(sim.registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fleetsim-http", daemon=True).start()

    def stop(self) -> None:
        """Stop ticking and serving."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()


def from_config(cfg: dict[str, Any]) -> FleetSim:
    """A FleetSim from the bench's JSON config (see bench/autoscale_bench.py)."""
    services = [
        ServiceSim(
            namespace=s["namespace"],
            name=s["name"],
            curve=DayCurve.from_json(s["curve"]),
            replica=Replica(**s["replica"]),
            seed=cfg.get("seed", 7),
        )
        for s in cfg["services"]
    ]
    return FleetSim(
        services,
        t0=cfg["t0"],
        kubeconfig=Path(cfg["kubeconfig"]),
        truth=Path(cfg["truth"]),
        port=cfg["port"],
        tick=cfg.get("tick", 1.0),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the simulator in the foreground until interrupted or the config's `until`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config.read_text())
    sim = from_config(cfg)
    print(f"FLEETSIM=http://127.0.0.1:{sim.port}", flush=True)
    try:
        sim.run(until=cfg.get("until"))
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
