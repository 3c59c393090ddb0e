"""The chat API: OpenAI-shaped chat completions over Triton, with sessions, a deadline and a breaker.

``python -m chatfleet_runtime.api --host=0.0.0.0 --port=8080 --triton-grpc=127.0.0.1:8001`` (pod contract).

Per request: validate (4xx naming the field) -> load the conversation's history from Redis (if a
session id is given) -> breaker and in-flight limit -> Triton over gRPC (``chat`` or, for
``stream: true``, the decoupled ``chat_stream``) within the deadline -> answer, save the turn. When
Triton is down, slow or overloaded the answer comes from the FAQ or fallback text, marked
``"chatfleet": {"fallback": true, ...}`` and with the header ``X-Chatfleet-Fallback``.

Session id, first found: header ``X-Session-Id``, body ``session_id``, body ``user`` (OpenAI's field;
a value that is not a valid session id, such as an e-mail address, is hashed into one).

Every response (JSON, stream, error, health) carries ``x-chatfleet-track`` (and ``x-chatfleet-revision``)
when the pod knows them (``CHATFLEET_TRACK``, ``CHATFLEET_REVISION``, set by the operator).

Draining (docs/runtime.md "Draining"): ``POST /drain`` (the pod's preStop hook,
``python3 -m chatfleet_runtime.drain``) or a SIGTERM that comes without it starts the drain: ``/readyz``
answers 503, every response carries ``Connection: close``, chat requests are served while they can
finish before the pod must exit and refused with a 503 after that; running streams are never cut.
``GET /drain`` says whether it is drained. On SIGTERM the server exits once drained (at once when the
preStop hook already drained it).

Shadow port (docs/runtime.md "Shadow traffic"): with ``--shadow-port=PORT`` the same server listens on a
second socket, and a request that arrived there (the ASGI scope's ``server`` port) gets only
``POST /v1/chat/completions`` (a mirrored request: ``ChatPipeline.shadow_chat``) and
``POST /shadow/records`` (take the records); anything else there is a 404, and the chat port has no
``/shadow/records``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Mapping

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from chatfleet_runtime.apisettings import ApiSettings
from chatfleet_runtime.backend import TritonChat
from chatfleet_runtime.drain import Drain
from chatfleet_runtime.pipeline import ChatPipeline
from chatfleet_runtime.responses import Reply

__all__ = ["ApiSettings", "create_app", "main", "serve"]

log = logging.getLogger("chatfleet.api")

#: The chat requests the drain counts (in flight, arrivals); probes, scrapes and /drain are not work, and
#: neither is anything on the shadow port (mirrors are refused once draining and never hold a drain).
WORK_PATHS = frozenset({"/v1/chat/completions"})


def on_port(scope, port: int) -> bool:
    """Whether an HTTP request arrived on this listening port (the ASGI scope's ``server``); 0 never does."""
    server = scope.get("server")
    return bool(port) and server is not None and server[1] == port


class TrackHeaders:
    """ASGI middleware: adds fixed headers (track, revision) to every HTTP response, streams included.

    Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would wrap streaming responses and
    break the client-disconnect cancellation the streams rely on.
    """

    def __init__(self, app, headers: Mapping[str, str]):
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope, receive, send):
        """Pass through, adding the headers to `http.response.start`."""
        if scope["type"] != "http" or not self.headers:
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        return await self.app(scope, receive, send_with_headers)


class DrainGate:
    """ASGI middleware: counts chat requests in and out of the drain (arrival to last byte, streams
    included, a client that left included) and adds ``Connection: close`` to every response while
    draining, so keep-alive clients take their next request elsewhere."""

    def __init__(self, app, drain: Drain, shadow_port: int = 0):
        self.app = app
        self.drain = drain
        self.shadow_port = shadow_port

    async def __call__(self, scope, receive, send):
        """Pass through; count work requests, close connections while draining."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_closing(message):
            if message["type"] == "http.response.start" and self.drain.draining:
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"connection" for k, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        if scope["path"] not in WORK_PATHS or on_port(scope, self.shadow_port):
            return await self.app(scope, receive, send_closing)
        self.drain.enter()
        try:
            return await self.app(scope, receive, send_closing)
        finally:
            self.drain.leave()


Handler = Callable[[Request], Awaitable[Response]]


class ShadowPort:
    """ASGI middleware: a request that arrived on the shadow port gets the shadow routes and nothing else
    (404, whatever the method); a request on any other port passes on to the chat API's routes."""

    def __init__(self, app, port: int, routes: Mapping[tuple[str, str], Handler]):
        self.app = app
        self.port = port
        self.routes = routes
        """(method, path) -> handler."""

    async def __call__(self, scope, receive, send):
        """Route shadow-port requests here; pass everything else through."""
        if scope["type"] != "http" or not on_port(scope, self.port):
            return await self.app(scope, receive, send)
        route = self.routes.get((scope["method"], scope["path"]))
        if route is None:
            response: Response = JSONResponse({"detail": "Not Found"}, status_code=404)
        else:
            response = await route(Request(scope, receive))
        await response(scope, receive, send)


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
    pipeline = ChatPipeline(settings, backend, redis_client, clock=clock)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(pipeline.wait_ready())
        yield
        task.cancel()
        await pipeline.close()

    async def shadow_chat(request: Request) -> Response:
        """A mirrored chat request (greedy, never streamed, never saved, recorded)."""
        return send(await pipeline.shadow_chat(await request.body(), request.headers))

    async def shadow_records(_request: Request) -> Response:
        """Take the records: ``{"records": [...], "overflowed": n}``, both gone from the pod afterwards."""
        return JSONResponse(pipeline.shadow.take())

    app = FastAPI(title="chatfleet chat API", lifespan=lifespan)
    if settings.shadow_port:  # innermost: the track headers and the drain's Connection: close apply too
        routes = {("POST", "/v1/chat/completions"): shadow_chat, ("POST", "/shadow/records"): shadow_records}
        app.add_middleware(ShadowPort, port=settings.shadow_port, routes=routes)
    echo = {"x-chatfleet-track": settings.track, "x-chatfleet-revision": settings.revision}
    app.add_middleware(TrackHeaders, headers={k: v for k, v in echo.items() if v})
    app.add_middleware(DrainGate, drain=pipeline.drain, shadow_port=settings.shadow_port)
    app.state.pipeline, app.state.settings, app.state.metrics = pipeline, settings, pipeline.metrics
    app.state.drain = pipeline.drain
    app.state.breaker, app.state.backend = pipeline.breaker, backend

    @app.get("/healthz")
    async def healthz():
        """Liveness: the process serves HTTP."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        """Readiness: Triton's chat model has been ready once (afterwards the breaker covers outages), and
        the replica is not draining."""
        if pipeline.drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if pipeline.ready:
            return {"status": "ready", "breaker": pipeline.breaker.state}
        return JSONResponse({"status": "waiting for triton"}, status_code=503)

    @app.post("/drain")
    async def begin_drain():
        """Start draining (idempotent; the preStop hook's call); the drain's state."""
        return pipeline.begin_drain()

    @app.get("/drain")
    async def drain_state():
        """The drain's state: draining, inflight, drained, since_seconds, refused."""
        return pipeline.drain.state()

    @app.get("/metrics")
    async def prometheus_metrics():
        """The pod's one scrape endpoint: the API's metrics, then Triton's (re-exported) when configured."""
        return PlainTextResponse(await pipeline.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        """The one model this deployment serves (OpenAI list shape)."""
        return pipeline.models()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        """OpenAI chat completions (JSON or server-sent events)."""
        return send(await pipeline.chat(await request.body(), request.headers))

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


def serve(app: FastAPI, host: str, port: int, log_level: str = "warning") -> None:
    """Serve the app with uvicorn, draining on SIGTERM (DrainingServer); with a shadow port, one server on
    two sockets, so the drain and the SIGTERM handling cover both."""
    pipeline: ChatPipeline = app.state.pipeline
    shadow_port = pipeline.settings.shadow_port
    if shadow_port and shadow_port == port:
        raise ValueError(f"the shadow port must differ from the chat port ({port})")
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
    if not shadow_port:
        server.run()
        return
    # Requests are told apart by the port they arrived on (ShadowPort, DrainGate): scope["server"].
    server.run(sockets=[_listen(host, port), _listen(host, shadow_port)])


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
        "--shadow-port",
        type=int,
        default=defaults.shadow_port,
        help="serve mirrored chat requests and /shadow/records on this port too (0: off)",
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
    if args.shadow_port and args.shadow_port == args.port:
        parser.error(f"--shadow-port: must differ from --port ({args.port})")
    if args.shadow_max_tokens < 1 or args.shadow_concurrency < 1:
        parser.error("--shadow-max-tokens and --shadow-concurrency: must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ApiSettings.from_env(
        triton_grpc=args.triton_grpc,
        model_name=args.model_name,
        redis_url=args.redis_url,
        shadow_port=args.shadow_port,
        shadow_max_tokens=args.shadow_max_tokens,
        shadow_concurrency=args.shadow_concurrency,
    )
    serve(create_app(settings), args.host, args.port, args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
