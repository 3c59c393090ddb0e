"""A traffic simulator: a Prometheus exporter with the runtime's metric names, per-track knobs set at run time.

kwok pods run no containers, so release tests, the demo and the benchmark point a real Prometheus at this
exporter instead. It serves, on 127.0.0.1, the same families the chat API exports (docs/metrics.md:
chatfleet_requests_total, chatfleet_request_duration_seconds, chatfleet_time_to_first_token_seconds,
same buckets), with the `namespace` and `track` labels Prometheus would add by relabelling the pods.

Per track (stable, canary, preview) a test sets requests per second, error rate, latency and TTFT:
- in-process:  sim = TrafficSim("default", "support-bot").start(); sim.set("canary", error_rate=0.05)
- over HTTP:   POST /control {"track": "canary", "rps": 20, "error_rate": 0.05, "latency_ms": 900}
- no traffic:  sim.set("canary", rps=0)
It also answers chat completions at /probe/<track>/v1/chat/completions (the operator's bounded probe
load), counting each as one request of that track with the track's error rate and latency.

CLI: python -m chatfleet_platform.load.trafficsim --namespace default --service support-bot [--port N]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from chatfleet_platform.common import procs

#: The chat API's latency buckets (runtime/chatfleet_runtime/chat/metrics.py), so quantiles match production.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
TRACKS = ("stable", "canary", "preview")


@dataclass
class TrackKnobs:
    """What one track's traffic looks like now."""

    rps: float = 0.0
    error_rate: float = 0.0
    latency_ms: float = 120.0
    ttft_ms: float = 40.0
    revision: str = ""


class TrafficSim:
    """Exporter + traffic generator for one ChatbotService (thread-based, stops cleanly)."""

    def __init__(self, namespace: str, service: str, port: int = 0, tick_seconds: float = 0.1) -> None:
        self.namespace, self.service = namespace, service
        self.port = port or procs.free_port()
        self.tick_seconds = tick_seconds
        self.knobs: dict[str, TrackKnobs] = {t: TrackKnobs() for t in TRACKS}
        self.registry = CollectorRegistry()
        labels = ["namespace", "track", "model", "outcome", "code", "stream"]
        self.requests = Counter(
            "chatfleet_requests", "Chat completion requests", labels, registry=self.registry
        )
        hist_labels = ["namespace", "track", "model", "stream"]
        self.duration = Histogram(
            "chatfleet_request_duration_seconds",
            "Whole response time",
            hist_labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "chatfleet_time_to_first_token_seconds",
            "Time to first token",
            hist_labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._carry: dict[str, float] = {t: 0.0 for t in TRACKS}
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._rng = random.Random(7)

    # ---- knobs -------------------------------------------------------------------------------------
    def set(self, track: str, **knobs: Any) -> None:
        """Change one track's knobs, e.g. set('canary', rps=20, error_rate=0.05, latency_ms=900)."""
        with self._lock:
            current = asdict(self.knobs[track])
            current.update({k: v for k, v in knobs.items() if v is not None})
            self.knobs[track] = TrackKnobs(**current)

    def healthy(self, rps: float = 20.0) -> None:
        """Stable and canary both healthy with traffic."""
        for track in ("stable", "canary"):
            self.set(track, rps=rps, error_rate=0.002, latency_ms=120, ttft_ms=40)

    @property
    def target(self) -> str:
        """host:port for a Prometheus scrape config."""
        return f"127.0.0.1:{self.port}"

    # ---- traffic -----------------------------------------------------------------------------------
    def record(self, track: str, *, error: bool, latency_s: float, ttft_s: float) -> None:
        """Count one request of a track."""
        base = {"namespace": self.namespace, "track": track, "model": self.service}
        outcome, code = ("error", "500") if error else ("success", "200")
        self.requests.labels(**base, outcome=outcome, code=code, stream="true").inc()
        self.duration.labels(**base, stream="true").observe(latency_s)
        self.ttft.labels(**base, stream="true").observe(ttft_s)

    def _one(self, track: str, k: TrackKnobs) -> bool:
        """Simulate one request; whether it failed."""
        error = self._rng.random() < k.error_rate
        jitter = self._rng.uniform(0.8, 1.2)
        self.record(
            track, error=error, latency_s=k.latency_ms * jitter / 1000, ttft_s=k.ttft_ms * jitter / 1000
        )
        return error

    def _loop(self) -> None:
        """Every tick, emit rps * tick requests per track (fractions carried over)."""
        while not self._stop.wait(self.tick_seconds):
            with self._lock:
                knobs = dict(self.knobs)
            for track, k in knobs.items():
                self._carry[track] += k.rps * self.tick_seconds
                while self._carry[track] >= 1:
                    self._carry[track] -= 1
                    self._one(track, k)

    # ---- server ------------------------------------------------------------------------------------
    def start(self) -> TrafficSim:
        """Serve /metrics, /control and /probe on 127.0.0.1 and start generating traffic."""
        sim = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                """Stay quiet (tests read their own output)."""

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                """/metrics (exposition) and /control (current knobs)."""
                if self.path.startswith("/metrics"):
                    self._send(200, generate_latest(sim.registry), CONTENT_TYPE_LATEST)
                elif self.path.startswith("/control"):
                    self._send(200, json.dumps({t: asdict(k) for t, k in sim.knobs.items()}).encode())
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:
                """/control (set knobs) and /probe/<track>/... (one counted request)."""
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                if self.path.startswith("/control"):
                    track = body.pop("track", "canary")
                    sim.set(track, **body)
                    self._send(200, json.dumps(asdict(sim.knobs[track])).encode())
                elif self.path.startswith("/probe/"):
                    track = self.path.split("/")[2]
                    k = sim.knobs.get(track, TrackKnobs())
                    failed = sim._one(track, k)
                    reply = {"choices": [{"message": {"role": "assistant", "content": "probe"}}]}
                    self._send(500 if failed else 200, json.dumps(reply).encode())
                else:
                    self._send(404, b"{}")

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="trafficsim-http", daemon=True),
            threading.Thread(target=self._loop, name="trafficsim-traffic", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stop the generator and the server."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> TrafficSim:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the simulator in the foreground until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--service", default="support-bot")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rps", type=float, default=0.0, help="initial requests/s on stable and canary")
    args = parser.parse_args(argv)
    sim = TrafficSim(args.namespace, args.service, args.port).start()
    if args.rps:
        sim.healthy(args.rps)
    print(f"TRAFFICSIM=http://{sim.target}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
