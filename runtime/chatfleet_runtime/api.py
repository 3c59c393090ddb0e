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
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet_contract.parameters import ModelParameters, read_model_config
from chatfleet_contract.tritonconfig import MODEL_NAME, STREAM_MODEL_NAME
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chatfleet_runtime.breaker import STATE_VALUE, CircuitBreaker, Fallback
from chatfleet_runtime.metrics import ApiMetrics
from chatfleet_runtime.prompting import (
    RequestError,
    check_openai_fields,
    parse_sampling,
    session_key_from_user,
    validate_messages,
    validate_session_id,
)
from chatfleet_runtime.sessions import ActiveSessions, SessionStore, compose

log = logging.getLogger("chatfleet.api")
INVALID = "invalid_request: "
DEFAULT_FALLBACK = "Sorry, the assistant is busy right now. Please try again in a moment."


@dataclass(frozen=True)
class ApiSettings:
    """Chat API settings (environment names in docs/pod-contract.md)."""

    model_name: str = "chat"
    triton_grpc: str = "127.0.0.1:8001"
    redis_url: str | None = None
    session_ttl_s: int = 3600
    history_turns: int = 5
    request_timeout_s: float = 30.0
    fallback_text: str = DEFAULT_FALLBACK
    faq: str | None = None
    max_new_tokens: int | None = None
    """Limit on max_tokens; None reads the chat model's `max_new_tokens` parameter from Triton (else its default)."""
    max_inflight: int = 256
    breaker_failures: int = 3
    breaker_reset_s: float = 5.0
    max_body_bytes: int = 1_000_000
    track: str | None = None
    """The pod's release track (stable, canary, preview), echoed as `x-chatfleet-track`."""
    revision: str | None = None
    """The pod's revision hash, echoed as `x-chatfleet-revision`."""
    triton_metrics_url: str | None = None
    """Triton's metrics endpoint, re-exported on this API's /metrics (None: not re-exported)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ApiSettings:
        """Settings from CHATFLEET_* environment variables, then explicit overrides."""
        env = os.environ if env is None else env
        pick = {
            "model_name": ("CHATFLEET_MODEL_NAME", str),
            "redis_url": ("CHATFLEET_REDIS_URL", str),
            "session_ttl_s": ("CHATFLEET_SESSION_TTL_SECONDS", int),
            "history_turns": ("CHATFLEET_HISTORY_TURNS", int),
            "request_timeout_s": ("CHATFLEET_REQUEST_TIMEOUT_SECONDS", float),
            "fallback_text": ("CHATFLEET_FALLBACK_TEXT", str),
            "faq": ("CHATFLEET_FAQ", str),
            "max_new_tokens": ("CHATFLEET_MAX_NEW_TOKENS", int),
            "max_inflight": ("CHATFLEET_MAX_INFLIGHT", int),
            "breaker_failures": ("CHATFLEET_BREAKER_FAILURES", int),
            "breaker_reset_s": ("CHATFLEET_BREAKER_RESET_SECONDS", float),
            "track": ("CHATFLEET_TRACK", str),
            "revision": ("CHATFLEET_REVISION", str),
            "triton_metrics_url": ("CHATFLEET_TRITON_METRICS_URL", str),
        }
        values: dict[str, Any] = {}
        for field_name, (var, kind) in pick.items():
            if env.get(var):
                values[field_name] = kind(env[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


class BackendError(Exception):
    """A failed Triton call; kind is invalid (client's fault), unavailable, timeout or error."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class Chunk:
    """A piece of a response: text and, on the last one, the finish reason and token counts."""

    text: str
    finish_reason: str = ""
    num_tokens: int = 0
    prompt_tokens: int = 0


def _classify(exc: Exception) -> BackendError:
    msg = str(exc)
    if INVALID in msg:
        return BackendError("invalid", msg[msg.index(INVALID) + len(INVALID) :].strip())
    status = str(getattr(exc, "status", lambda: "")() or "")
    if "UNAVAILABLE" in status or "UNAVAILABLE" in msg or "failed to connect" in msg.lower():
        return BackendError("unavailable", msg)
    if "DEADLINE_EXCEEDED" in status or "Deadline" in msg:
        return BackendError("timeout", msg)
    return BackendError("error", msg)


class TritonChat:
    """Calls the chat models through tritonclient's asyncio gRPC client (one channel per API process)."""

    def __init__(self, url: str):
        import tritonclient.grpc.aio as grpcclient

        self._mod = grpcclient
        self.url = url
        self._client = None

    @property
    def client(self):
        """The gRPC client, created on first use inside the serving event loop (aio channels bind to it)."""
        if self._client is None:
            self._client = self._mod.InferenceServerClient(self.url)
        return self._client

    def _inputs(self, messages: list[dict[str, str]], params: dict[str, Any]):
        import numpy as np

        a = self._mod.InferInput("MESSAGES", [1, 1], "BYTES")
        a.set_data_from_numpy(np.array([[json.dumps(messages).encode()]], dtype=np.object_))
        b = self._mod.InferInput("PARAMETERS", [1, 1], "BYTES")
        b.set_data_from_numpy(np.array([[json.dumps(params).encode()]], dtype=np.object_))
        return [a, b]

    async def ready(self) -> bool:
        """Whether the chat model is loaded and warmed up."""
        try:
            return bool(await self.client.is_model_ready(MODEL_NAME))
        except Exception:
            return False

    async def max_new_tokens(self) -> int | None:
        """The chat model's max_new_tokens parameter (None when it cannot be read)."""
        try:
            cfg = await self.client.get_model_config(MODEL_NAME, as_json=True)
            params, _, _ = read_model_config(cfg["config"])
            return ModelParameters.from_parameters(params).max_new_tokens
        except Exception:
            return None

    async def complete(self, messages, params, timeout: float) -> Chunk:
        """One non-streaming completion."""
        try:
            res = await self.client.infer(MODEL_NAME, self._inputs(messages, params), client_timeout=timeout)
        except Exception as exc:
            raise _classify(exc) from exc
        return _chunk(res)

    async def stream(self, messages, params, timeout: float) -> AsyncIterator[Chunk]:
        """Streamed completion: deltas, the last one with a finish reason; cancels Triton on exit."""

        async def one():
            yield {"model_name": STREAM_MODEL_NAME, "inputs": self._inputs(messages, params)}

        call = self.client.stream_infer(one(), stream_timeout=timeout)
        try:
            async for result, error in call:
                if error is not None:
                    raise _classify(error)
                chunk = _chunk(result)
                yield chunk
                if chunk.finish_reason:
                    return
            raise BackendError("error", "stream ended without a final response")
        except BackendError:
            raise
        except (StopAsyncIteration, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            raise _classify(exc) from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        """Close the channel."""
        if self._client is not None:
            await self._client.close()


def _chunk(result) -> Chunk:
    """A Chunk from a Triton result (PROMPT_TOKENS may be missing on an older model config)."""
    prompt = result.as_numpy("PROMPT_TOKENS")
    return Chunk(
        result.as_numpy("TEXT").reshape(-1)[0].decode("utf-8", "replace"),
        result.as_numpy("FINISH_REASON").reshape(-1)[0].decode(),
        int(result.as_numpy("NUM_TOKENS").reshape(-1)[0]),
        int(prompt.reshape(-1)[0]) if prompt is not None else 0,
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


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


def _error(status: int, message: str):
    param = message.split(":", 1)[0] if ":" in message else None
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = "model_not_found" if status == 404 else None
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status
    )


def _redis_client(url: str | None):
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


def create_app(settings: ApiSettings, backend=None, redis_client=None):
    """Build the FastAPI app (backend and Redis client injectable for tests)."""
    name = settings.model_name
    metrics = ApiMetrics()
    backend = backend if backend is not None else TritonChat(settings.triton_grpc)
    if redis_client is None:
        redis_client = _redis_client(settings.redis_url)
    store = SessionStore(
        redis_client,
        namespace=name,
        ttl_s=settings.session_ttl_s,
        turns=settings.history_turns,
        on_error=lambda op: metrics.session_errors.labels(name, op).inc(),
    )
    active = ActiveSessions(settings.session_ttl_s)

    def on_change(old: str, new: str) -> None:
        metrics.breaker_state.labels(name).set(STATE_VALUE[new])
        metrics.breaker_transitions.labels(name, new).inc()
        log.warning("circuit breaker %s -> %s", old, new)

    breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_reset_s, on_change=on_change)
    metrics.breaker_state.labels(name).set(0)
    fallback = Fallback.from_config(settings.fallback_text, settings.faq)
    inflight = {"n": 0}
    state = {"ready": False}

    limits = {"max_new_tokens": settings.max_new_tokens or ModelParameters().max_new_tokens}

    async def wait_ready() -> None:
        while not state["ready"]:
            ready = await backend.ready()
            if ready and settings.max_new_tokens is None and hasattr(backend, "max_new_tokens"):
                limits["max_new_tokens"] = await backend.max_new_tokens() or limits["max_new_tokens"]
            state["ready"] = ready
            if not ready:
                await asyncio.sleep(0.5)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(wait_ready())
        yield
        task.cancel()
        with contextlib.suppress(Exception):
            await backend.close()
        if redis_client is not None:
            with contextlib.suppress(Exception):
                await redis_client.aclose()

    app = FastAPI(title="chatfleet chat API", lifespan=lifespan)
    echo = {"x-chatfleet-track": settings.track, "x-chatfleet-revision": settings.revision}
    app.add_middleware(TrackHeaders, headers={k: v for k, v in echo.items() if v})
    app.state.settings, app.state.metrics, app.state.breaker, app.state.backend = (
        settings,
        metrics,
        breaker,
        backend,
    )

    @app.get("/healthz")
    async def healthz():
        """Liveness: the process serves HTTP."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        """Readiness: Triton's chat model has been ready once (afterwards the breaker covers outages)."""
        if state["ready"]:
            return {"status": "ready", "breaker": breaker.state}
        return JSONResponse({"status": "waiting for triton"}, status_code=503)

    async def triton_metrics() -> str:
        """Triton's exposition text ('' when not configured or unreachable within 2 s)."""
        if not settings.triton_metrics_url:
            return ""
        import httpx

        try:
            async with httpx.AsyncClient(timeout=2.0) as http:
                resp = await http.get(settings.triton_metrics_url)
                resp.raise_for_status()
        except Exception as exc:
            log.warning("Triton metrics not re-exported: %s", exc)
            metrics.triton_up.labels(name).set(0)
            return ""
        metrics.triton_up.labels(name).set(1)
        text = resp.text
        return text if text.endswith("\n") else text + "\n"

    @app.get("/metrics")
    async def prometheus_metrics():
        """The pod's one scrape endpoint: the API's metrics, then Triton's (re-exported) when configured."""
        metrics.active_sessions.labels(name).set(active.count())
        metrics.breaker_state.labels(name).set(STATE_VALUE[breaker.state])
        triton = await triton_metrics()
        own = generate_latest(metrics.registry).decode()
        return PlainTextResponse(own + triton, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        """The one model this deployment serves (OpenAI list shape)."""
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": 0, "owned_by": "chatfleet"}],
        }

    def envelope(obj: str, sid: str | None, extra: dict[str, Any]) -> dict[str, Any]:
        extra = {k: v for k, v in extra.items() if k != "ignored_fields" or v}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": obj,
            "created": int(time.time()),
            "model": name,
            "chatfleet": {"session_id": sid, "fallback": False, **extra},
        }

    def count(outcome: str, code: int, stream: bool) -> None:
        metrics.requests.labels(name, outcome, str(code), str(stream).lower()).inc()

    def fallback_response(messages, sid, stream: bool, reason: str, info: dict[str, Any], t0: float):
        text, source = fallback.answer(messages)
        metrics.fallbacks.labels(name, reason, source).inc()
        count("fallback", 200, stream)
        metrics.duration.labels(name, str(stream).lower()).observe(time.monotonic() - t0)
        meta = {"fallback": True, "reason": reason, "source": source, **info}
        headers = {"X-Chatfleet-Fallback": source}
        if not stream:
            body = envelope("chat.completion", sid, meta)
            body["choices"] = [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ]
            body["usage"] = _usage(0, 0)
            return JSONResponse(body, headers=headers)

        async def events():
            chunk = envelope("chat.completion.chunk", sid, meta)
            chunk["choices"] = [
                {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ]
            yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        """OpenAI chat completions (JSON or server-sent events)."""
        t0 = time.monotonic()
        stream = False
        try:
            raw = await request.body()
            if len(raw) > settings.max_body_bytes:
                raise RequestError(
                    f"body: {len(raw)} bytes is more than the limit {settings.max_body_bytes}", 413
                )
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(f"body: not valid JSON ({getattr(exc, 'msg', exc)})") from exc
            if not isinstance(body, dict):
                raise RequestError("body: must be a JSON object")
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError("stream: must be true or false")
            model = body.get("model", name)
            if model != name:
                raise RequestError(f"model: {model!r:.80} is not served here (available: {name})", 404)
            messages = validate_messages(body.get("messages"))
            ignored = check_openai_fields(body)
            sampling = parse_sampling(body, max_new_tokens_limit=limits["max_new_tokens"])
            if body.get("n", 1) not in (1, None):
                raise RequestError("n: only 1 is supported")
            sid = None
            if request.headers.get("x-session-id") is not None:
                sid = validate_session_id(request.headers["x-session-id"], "X-Session-Id")
            elif body.get("session_id") is not None:
                sid = validate_session_id(body["session_id"], "session_id")
            elif body.get("user") is not None:
                sid = session_key_from_user(body["user"])
        except RequestError as exc:
            count("client_error", exc.status, stream)
            return _error(exc.status, str(exc))

        history_state = "none"
        prompt_messages = messages
        if sid is not None:
            active.touch(sid)
            history, ok = await store.history(sid)
            history_state = "ok" if ok else "unavailable"
            prompt_messages = compose(messages, history)
        params = {
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop": list(sampling.stop),
            "seed": sampling.seed,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "logit_bias": {str(t): b for t, b in sampling.logit_bias},
            "session_id": sid,
        }
        if ignored:
            log.info("ignored unknown request fields: %s", ", ".join(ignored))
        info = {"history": history_state, "ignored_fields": ignored}
        if not breaker.allow():
            return fallback_response(messages, sid, stream, "circuit_open", info, t0)
        if inflight["n"] >= settings.max_inflight:
            breaker.release()
            return fallback_response(messages, sid, stream, "overloaded", info, t0)
        new_messages = [m for m in messages if m["role"] != "system"]
        if not stream:
            return await complete(prompt_messages, new_messages, params, sid, info, t0)
        return await start_stream(prompt_messages, new_messages, params, sid, info, t0)

    async def complete(prompt_messages, new_messages, params, sid, info, t0):
        inflight["n"] += 1
        metrics.inflight.labels(name).inc()
        try:
            async with asyncio.timeout(settings.request_timeout_s):
                result = await backend.complete(prompt_messages, params, settings.request_timeout_s)
        except BackendError as exc:
            if exc.kind == "invalid":
                breaker.record_success()
                count("client_error", 400, False)
                return _error(400, str(exc))
            breaker.record_failure()
            return fallback_response(new_messages, sid, False, exc.kind, info, t0)
        except TimeoutError:
            breaker.record_failure()
            return fallback_response(new_messages, sid, False, "timeout", info, t0)
        finally:
            inflight["n"] -= 1
            metrics.inflight.labels(name).dec()
        breaker.record_success()
        elapsed = time.monotonic() - t0
        metrics.duration.labels(name, "false").observe(elapsed)
        metrics.ttft.labels(name, "false").observe(elapsed)
        metrics.tokens.labels(name).inc(result.num_tokens)
        count("success", 200, False)
        if sid is not None:
            await store.append(sid, new_messages, result.text)
        body = envelope("chat.completion", sid, info)
        body["choices"] = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason or "stop",
            }
        ]
        body["usage"] = _usage(result.prompt_tokens, result.num_tokens)
        return JSONResponse(body)

    async def start_stream(prompt_messages, new_messages, params, sid, info, t0):
        deadline = t0 + settings.request_timeout_s
        it = backend.stream(prompt_messages, params, settings.request_timeout_s).__aiter__()
        inflight["n"] += 1
        metrics.inflight.labels(name).inc()
        released = {"done": False}

        def release():
            if not released["done"]:
                released["done"] = True
                inflight["n"] -= 1
                metrics.inflight.labels(name).dec()

        async def close_it():
            with contextlib.suppress(BaseException):
                await it.aclose()

        try:
            async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                first = await it.__anext__()
        except BackendError as exc:
            release()
            await close_it()
            if exc.kind == "invalid":
                breaker.record_success()
                count("client_error", 400, True)
                return _error(400, str(exc))
            breaker.record_failure()
            return fallback_response(new_messages, sid, True, exc.kind, info, t0)
        except (TimeoutError, StopAsyncIteration):
            release()
            await close_it()
            breaker.record_failure()
            return fallback_response(new_messages, sid, True, "timeout", info, t0)
        ttft = time.monotonic() - t0
        metrics.ttft.labels(name, "true").observe(ttft)

        async def events():
            chunk_id = envelope("chat.completion.chunk", sid, info)
            parts: list[str] = []
            finish, num_tokens, prompt_tokens, last = "", 0, 0, time.monotonic()
            completed = timed_out = False

            def sse(delta: dict[str, Any], finish_reason: str | None, usage: dict | None = None) -> str:
                chunk = dict(chunk_id)
                chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
                if usage is not None:
                    chunk["usage"] = usage
                return f"data: {json.dumps(chunk)}\n\n"

            try:
                yield sse({"role": "assistant", "content": ""}, None)
                chunk = first
                while True:
                    if chunk.text:
                        parts.append(chunk.text)
                        yield sse({"content": chunk.text}, None)
                    if chunk.finish_reason:
                        finish, num_tokens = chunk.finish_reason, chunk.num_tokens
                        prompt_tokens = chunk.prompt_tokens
                        break
                    try:
                        async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                            chunk = await it.__anext__()
                    except TimeoutError:
                        # The deadline cut the answer short: the client gets what came, ended as
                        # "length", but it is an error for the metrics (and the canary analysis).
                        finish, timed_out = "length", True
                        breaker.record_failure()
                        break
                    now = time.monotonic()
                    metrics.itl.labels(name).observe(now - last)
                    last = now
                if not timed_out:
                    breaker.record_success()
                usage = _usage(prompt_tokens, num_tokens)
                yield sse({}, "length" if finish == "length" else "stop", usage)
                yield "data: [DONE]\n\n"
                completed = True
            except BackendError:
                breaker.record_failure()
                yield sse({}, "stop")
                yield "data: [DONE]\n\n"
                completed = True
                count("error", 200, True)
                return
            finally:
                release()
                await close_it()
                if not completed:
                    metrics.disconnects.labels(name).inc()
                    breaker.release()
                    count("client_error", 499, True)
            elapsed = time.monotonic() - t0
            metrics.duration.labels(name, "true").observe(elapsed)
            metrics.tokens.labels(name).inc(num_tokens)
            if timed_out:
                count("error", 200, True)
                return
            if num_tokens > 1 and elapsed > ttft:
                metrics.tps.labels(name).observe(num_tokens / (elapsed - ttft))
            count("success", 200, True)
            if sid is not None:
                await store.append(sid, new_messages, "".join(parts))

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

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
