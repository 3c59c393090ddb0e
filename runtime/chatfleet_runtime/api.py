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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from chatfleet_runtime.apisettings import ApiSettings
from chatfleet_runtime.backend import TritonChat
from chatfleet_runtime.pipeline import ChatPipeline
from chatfleet_runtime.responses import Reply

__all__ = ["ApiSettings", "create_app", "main"]


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


def _redis_client(url: str | None):
    """An asyncio Redis client that fails fast (0.5 s, no retries), or None without a URL."""
    if not url:
        return None
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.from_url(
        url,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def send(reply: Reply):
    """The FastAPI response of a pipeline reply: JSON, or server-sent events."""
    if reply.events is not None:
        return StreamingResponse(reply.events, media_type="text/event-stream", headers=reply.headers)
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)


def create_app(settings: ApiSettings, backend=None, redis_client=None):
    """Build the FastAPI app: thin routes over one ChatPipeline (backend and Redis injectable for tests)."""
    if backend is None:
        backend = TritonChat(settings.triton_grpc)
    if redis_client is None:
        redis_client = _redis_client(settings.redis_url)
    pipeline = ChatPipeline(settings, backend, redis_client)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(pipeline.wait_ready())
        yield
        task.cancel()
        await pipeline.close()

    app = FastAPI(title="chatfleet chat API", lifespan=lifespan)
    echo = {"x-chatfleet-track": settings.track, "x-chatfleet-revision": settings.revision}
    app.add_middleware(TrackHeaders, headers={k: v for k, v in echo.items() if v})
    app.state.pipeline, app.state.settings, app.state.metrics = pipeline, settings, pipeline.metrics
    app.state.breaker, app.state.backend = pipeline.breaker, backend

    @app.get("/healthz")
    async def healthz():
        """Liveness: the process serves HTTP."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        """Readiness: Triton's chat model has been ready once (afterwards the breaker covers outages)."""
        if pipeline.ready:
            return {"status": "ready", "breaker": pipeline.breaker.state}
        return JSONResponse({"status": "waiting for triton"}, status_code=503)

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


def main(argv: list[str] | None = None) -> int:
    """Run the chat API with uvicorn (pod command; see docs/pod-contract.md)."""
    parser = argparse.ArgumentParser(description="chatfleet chat API")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--triton-grpc", default=os.environ.get("CHATFLEET_TRITON_GRPC", "127.0.0.1:8001"))
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ApiSettings.from_env(
        triton_grpc=args.triton_grpc, model_name=args.model_name, redis_url=args.redis_url
    )
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
