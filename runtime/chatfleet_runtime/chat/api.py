"""The chat API: OpenAI-shaped chat completions over Triton, with sessions, a deadline and a breaker.

``python -m chatfleet_runtime.chat.api --host=0.0.0.0 --port=8080 --triton-grpc=127.0.0.1:8001`` (pod contract).

Per request: validate (4xx naming the field) -> load the conversation's history from Redis (if a
session id is given) -> breaker and in-flight limit -> Triton over gRPC (the one decoupled model
``chat``, streamed or not) within the deadline -> answer, save the turn. When
Triton is down, slow or overloaded the answer comes from the FAQ or fallback text, marked
``"chatfleet": {"fallback": true, ...}`` and with the header ``X-Chatfleet-Fallback``.

With ``CHATFLEET_FALLBACK_FILE`` the FAQ and the breaker's thresholds follow that file while the API runs
(``chatfleet_runtime.chat.livesettings``): read at start-up before serving, then every
``CHATFLEET_FALLBACK_RELOAD_SECONDS`` by a background task that ends with the app.

Session id, first found: header ``X-Session-Id``, body ``session_id``, body ``user`` (OpenAI's field;
a value that is not a valid session id, such as an e-mail address, is hashed into one).

Every response (JSON, stream, error, health) carries ``x-chatfleet-track`` (and ``x-chatfleet-revision``)
when the pod knows them (``CHATFLEET_TRACK``, ``CHATFLEET_REVISION``, set by the operator).

Ports (docs/security.md "Ports"): each listening socket serves its own routes, told apart by the port a
request arrived on (the ASGI scope's ``server``; ``chatfleet_runtime.chat.middleware.PortRoutes``), and
nothing else there (404):

- chat (``--port``, 8080; end users, through the Service and the gateway): ``POST /v1/chat/completions``,
  ``GET /v1/models`` and ``GET /health`` (200 or 503, nothing more), nothing that changes the replica's state;
- admin (``--admin-port``, 8082; the kubelet, the pod itself, the operator): ``GET /healthz``,
  ``GET /readyz``, ``POST|GET /drain`` (from the pod's own loopback only: the preStop hook), and
  ``POST /shadow/records`` (the operator); no Service and no route carries it;
- metrics (``--metrics-port``, 8090; Prometheus): ``GET /metrics`` only;
- shadow (``--shadow-port``, 8081 in pods; the gateway's mirror): ``POST /v1/chat/completions`` only,
  answered as a mirrored request (``ChatPipeline.shadow_chat``).

Draining (docs/runtime.md "Draining"): ``POST /drain`` on the admin port (the pod's preStop hook,
``python3 -m chatfleet_runtime.chat.drain``) or a SIGTERM that comes without it starts the drain: ``/readyz``
answers 503, every response carries ``Connection: close`` once the drain settled, chat requests are served
while they can finish before the pod must exit and refused with a 503 after that; running streams are
never cut.
``GET /drain`` says whether it is drained. On SIGTERM the server exits once drained (at once when the
preStop hook already drained it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import socket
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from chatfleet_runtime.chat.apisettings import ApiSettings
from chatfleet_runtime.chat.backend import TritonChat
from chatfleet_runtime.chat.drain import Drain
from chatfleet_runtime.chat.middleware import DrainGate, Handler, PortRoutes, TrackHeaders, loopback_only
from chatfleet_runtime.chat.pipeline import ChatPipeline
from chatfleet_runtime.chat.responses import Reply
from chatfleet_runtime.chat.tracing import configure as configure_tracing
from chatfleet_runtime.chat.turn import RELAY_HEADER, REPLICA_HEADER

__all__ = ["ApiSettings", "create_app", "main", "serve"]

log = logging.getLogger("chatfleet.api")

#: Redis time-outs (seconds): a refused connection fails at once; a reply may take this long. Not less:
#: the time-out runs on the event loop's clock, and a chat API at its CPU limit serving many streams
#: (CFS throttling) reads a prompt reply late. At 0.5 s, 9 writes of one throttled replica failed both
#: tries in 9,000 turns of `make bench-release-traffic`, and those dialogues lost their history.
REDIS_TIMEOUT_S, REDIS_CONNECT_TIMEOUT_S = 2.0, 1.0


def _redis_client(url: str | None):
    """An asyncio Redis client with bounded time-outs and no retries of its own (SessionStore tries a
    failed operation again for a few seconds), or None without a URL."""
    if not url:
        return None
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.from_url(
        url,
        socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def send(reply: Reply):
    """The FastAPI response of a pipeline reply: JSON, or server-sent events."""
    if reply.events is not None:
        return StreamingResponse(reply.events, media_type="text/event-stream", headers=reply.headers)
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)


def create_app(settings: ApiSettings, backend=None, redis_client=None, clock=time.monotonic):
    """Build the FastAPI app: thin routes over one ChatPipeline (backend, Redis and the drain's clock
    injectable for tests)."""
    if backend is None:
        backend = TritonChat(settings.triton_grpc)
    if redis_client is None:
        redis_client = _redis_client(settings.redis_url)
    # spans of chat requests only with OTEL_EXPORTER_OTLP_ENDPOINT (spec.observability.tracing)
    pipeline = ChatPipeline(settings, backend, redis_client, clock=clock, tracing=configure_tracing(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app_):
        task = asyncio.create_task(pipeline.wait_ready())
        watch = None
        if pipeline.live is not None:  # the fallback file: read before serving, then every few seconds
            pipeline.live.poll()
            watch = asyncio.create_task(pipeline.live.watch(settings.fallback_reload_s))
        app_.state.fallback_watch = watch
        yield
        task.cancel()
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        await pipeline.close()

    async def shadow_chat(request: Request) -> Response:
        """A mirrored chat request (greedy, never streamed, never saved, recorded)."""
        return send(await pipeline.shadow_chat(await request.body(), request.headers))

    async def shadow_records(_request: Request) -> Response:
        """Take the records: ``{"records": [...], "overflowed": n}``, both gone from the pod afterwards."""
        return JSONResponse(pipeline.shadow.take())

    async def healthz(_request: Request) -> Response:
        """Liveness: the process serves HTTP."""
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        """Readiness: Triton's chat model has been ready once (afterwards the breaker covers outages), and
        the replica is not draining."""
        if pipeline.drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if pipeline.ready:
            return JSONResponse({"status": "ready", "breaker": pipeline.breaker.state})
        return JSONResponse({"status": "waiting for triton"}, status_code=503)

    @loopback_only
    async def begin_drain(_request: Request) -> Response:
        """Start draining (idempotent; the preStop hook's call); the drain's state."""
        return JSONResponse(pipeline.begin_drain())

    @loopback_only
    async def drain_state(_request: Request) -> Response:
        """The drain's state: draining, inflight, drained, since_seconds, refused."""
        return JSONResponse(pipeline.drain.state())

    async def prometheus_metrics(_request: Request) -> Response:
        """The pod's one scrape endpoint: the API's metrics, then Triton's (re-exported) when configured."""
        return PlainTextResponse(await pipeline.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    ports: dict[int, dict[tuple[str, str], Handler]] = {
        settings.admin_port: {
            ("GET", "/healthz"): healthz,
            ("GET", "/readyz"): readyz,
            ("POST", "/drain"): begin_drain,
            ("GET", "/drain"): drain_state,
            ("POST", "/shadow/records"): shadow_records,
        },
        settings.metrics_port: {("GET", "/metrics"): prometheus_metrics},
        settings.shadow_port: {("POST", "/v1/chat/completions"): shadow_chat},
    }
    app = FastAPI(
        title="chatfleet chat API",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # FastAPI's own telemetry off, whatever the environment says: the chat API's only spans are its
        # own (chat/tracing.py), which carry no request text (FastAPI's logs would carry exception messages)
        telemetry={"tracing": False, "metrics": False, "logs": False, "auto_configure": False},
    )
    # innermost: the track headers and the drain's Connection: close apply on every port
    app.add_middleware(PortRoutes, ports=ports)
    echo = {"x-chatfleet-track": settings.track, "x-chatfleet-revision": settings.revision}
    app.add_middleware(TrackHeaders, headers={k: v for k, v in echo.items() if v})
    other_ports = frozenset({settings.admin_port, settings.metrics_port, settings.shadow_port})
    app.add_middleware(DrainGate, drain=pipeline.drain, other_ports=other_ports)
    app.state.pipeline, app.state.settings, app.state.metrics = pipeline, settings, pipeline.metrics
    app.state.drain = pipeline.drain
    app.state.breaker, app.state.backend = pipeline.breaker, backend

    @app.get("/health")
    async def health():
        """Whether this replica takes chats now, for the clients and benchmark tools that ask first (guidellm;
        vLLM, SGLang and TGI serve the same path): 200 ``{"status": "ok"}``, else 503
        ``{"status": "unavailable"}`` (waiting for Triton, or draining). Nothing more: the reason, the breaker
        and the drain's counts are the admin port's."""
        if pipeline.ready and not pipeline.drain.draining:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    @app.get("/v1/models")
    async def models():
        """The one model this deployment serves (OpenAI list shape)."""
        return pipeline.models()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        """OpenAI chat completions (JSON or server-sent events); to the stream relay, with this replica's
        address (the local end of the connection: the pod's IP behind a Service)."""
        response = send(await pipeline.chat(await request.body(), request.headers))
        server = request.scope.get("server")
        if request.headers.get(RELAY_HEADER) and server:
            host, port = server[0], server[1]
            response.headers[REPLICA_HEADER] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return response

    return app


class DrainingServer(uvicorn.Server):
    """uvicorn's Server, except that a SIGTERM that finds the replica not draining (no preStop hook ran:
    a pod made without the hook, a local run) drains first: the listener stays open, /readyz fails,
    and the server stops once drained or at the pod's deadline. A SIGTERM after the preStop hook began
    the drain, a second SIGTERM or a SIGINT stop it at once. Either way uvicorn then waits for the
    responses still running (streams are not cut), at most until the pod's deadline."""

    def __init__(self, config: uvicorn.Config, pipeline: ChatPipeline):
        super().__init__(config)
        self.pipeline = pipeline
        self.sigterm = False
        """A SIGTERM arrived and was not acted on yet (on_tick does, outside the signal handler)."""
        self.draining_to_exit = False
        """The drain began on SIGTERM: stop once drained."""

    def handle_exit(self, sig, frame) -> None:
        """The signal handler: a first SIGTERM is left to on_tick, anything else is uvicorn's."""
        if sig == signal.SIGTERM and not (self.sigterm or self.draining_to_exit):
            self.sigterm = True
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s), first acting on a SIGTERM and checking a drain-to-exit."""
        drain = self.pipeline.drain
        if self.sigterm and not self.draining_to_exit:
            if drain.draining:
                self._stop(drain, "SIGTERM after the drain began (preStop hook)")
            else:
                self.draining_to_exit = True
                self.pipeline.begin_drain()
                log.warning("SIGTERM without a preStop hook: draining before exit")
        if self.draining_to_exit and not self.should_exit:
            exit_at = drain.exit_at()
            if drain.drained():
                self._stop(drain, "drained")
            elif exit_at is not None and drain.clock() >= exit_at:
                self._stop(drain, "the grace period is over")
        return await super().on_tick(counter)

    def _stop(self, drain: Drain, why: str) -> None:
        """Let uvicorn shut down, giving running responses until the pod's deadline."""
        exit_at = drain.exit_at()
        left = max(1.0, exit_at - drain.clock()) if exit_at is not None else 1.0
        self.config.timeout_graceful_shutdown = round(left)
        log.warning("stopping (%s): %s", why, drain.state())
        self.should_exit = True


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host has a colon, as uvicorn decides)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def listening_ports(settings: ApiSettings, port: int) -> list[int]:
    """The ports the server listens on: chat first, then admin, metrics and shadow (those not 0).

    e.g. port 8080 with the defaults and shadow 8081 -> [8080, 8082, 8090, 8081]. Two of them equal is a
    ValueError naming them: a request is routed by the port it arrived on, so each must be its own.
    """
    named = {
        "chat": port,
        "admin": settings.admin_port,
        "metrics": settings.metrics_port,
        "shadow": settings.shadow_port,
    }
    used = {name: p for name, p in named.items() if p}
    if "admin" not in used or "metrics" not in used:
        raise ValueError("the admin and metrics ports must be set (not 0)")
    seen: dict[int, str] = {}
    for name, p in used.items():
        if p in seen:
            raise ValueError(f"the {name} port must differ from the {seen[p]} port ({p})")
        seen[p] = name
    return list(used.values())


def serve(app: FastAPI, host: str, port: int, log_level: str = "warning") -> None:
    """Serve the app with uvicorn, draining on SIGTERM (DrainingServer): one server on a socket per port
    (chat, admin, metrics, shadow), so the drain and the SIGTERM handling cover them all."""
    pipeline: ChatPipeline = app.state.pipeline
    ports = listening_ports(pipeline.settings, port)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, round(pipeline.settings.grace_s)),
        # idle connections outlive the proxy's (it closes first; see ApiSettings.keep_alive_s)
        timeout_keep_alive=max(1, round(pipeline.settings.keep_alive_s)),
    )
    server = DrainingServer(config, pipeline)
    # Requests are told apart by the port they arrived on (PortRoutes, DrainGate): scope["server"].
    server.run(sockets=[_listen(host, p) for p in ports])


def install_stack_dump() -> None:
    """`kill -USR1 <pid>` writes every thread's Python stack to stderr (the container log), the process
    going on as before: where a chat API that stopped answering its probes is stuck. Set up in `main` before
    the app and its event loop start; even a process wedged inside a C call answers (faulthandler writes
    from the signal handler, without the event loop or the GIL's next switch)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def main(argv: list[str] | None = None) -> int:
    """Run the chat API with uvicorn (pod command; see docs/pod-contract.md)."""
    parser = argparse.ArgumentParser(description="chatfleet chat API")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--triton-grpc", default=os.environ.get("CHATFLEET_TRITON_GRPC", "127.0.0.1:8001"))
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--log-level", default="warning")
    defaults = ApiSettings()
    parser.add_argument(
        "--admin-port",
        type=int,
        default=defaults.admin_port,
        help="probes, the drain (loopback only) and the shadow records; never on the user path",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=defaults.metrics_port, help="GET /metrics for Prometheus, only"
    )
    parser.add_argument(
        "--shadow-port",
        type=int,
        default=defaults.shadow_port,
        help="serve mirrored chat requests on this port too (0: off)",
    )
    parser.add_argument(
        "--shadow-max-tokens",
        type=int,
        default=defaults.shadow_max_tokens,
        help="a mirrored request's max_tokens is at most this",
    )
    parser.add_argument(
        "--shadow-concurrency",
        type=int,
        default=defaults.shadow_concurrency,
        help="mirrored generations in flight at most; one more is refused with 429",
    )
    args = parser.parse_args(argv)
    if args.shadow_max_tokens < 1 or args.shadow_concurrency < 1:
        parser.error("--shadow-max-tokens and --shadow-concurrency: must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_stack_dump()
    settings = ApiSettings.from_env(
        triton_grpc=args.triton_grpc,
        model_name=args.model_name,
        redis_url=args.redis_url,
        admin_port=args.admin_port,
        metrics_port=args.metrics_port,
        shadow_port=args.shadow_port,
        shadow_max_tokens=args.shadow_max_tokens,
        shadow_concurrency=args.shadow_concurrency,
    )
    try:
        listening_ports(settings, args.port)
    except ValueError as exc:
        parser.error(f"--port, --admin-port, --metrics-port, --shadow-port: {exc}")
    serve(create_app(settings), args.host, args.port, args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
