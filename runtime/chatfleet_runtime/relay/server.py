"""The stream relay's server: chat requests passed to the chat API's replicas, streams resumed on another
replica when cut.

``python -m chatfleet_runtime.relay --upstream http://10.0.0.7:8080 --upstream http://10.0.0.8:8080``, or
``--upstream http://chat-headless:8080 --resolve`` to use every address the name resolves to (a headless
Service: one per ready pod, read again every few seconds).

Routes (``--port``; end users, in front of the chat Service): ``POST /v1/chat/completions``,
``GET /v1/models`` and ``GET /health``; ``GET /metrics`` on ``--metrics-port`` only (Prometheus).

A streamed request goes to one replica. The client's response begins when that replica answers 200; a
replica that cannot be reached or answers 502, 503 or 504 before streaming is skipped for the next (any
other status, such as a 400 naming a field, is the client's answer). While streaming, a cut is: the
connection closed or broken before ``[DONE]``, no bytes for ``--stall-seconds`` (a node gone silent), or
the chat API's ``stream_cut`` error event (its Triton failed part-way). On a cut the relay asks the next
replica to continue the answer (``splice.resume_body``), at most ``--max-resumes`` times; when none can, the
client gets the ``stream_cut`` error event (OpenAI's SDK raises it), never a stream that looks complete.

A dialogue's turns go to the replica that answered its last one (``Affinity``; the dialogue is the
``X-Session-Id`` header, else the body's ``session_id``, else its ``user``): its KV prefix and its copy of the
dialogue's window are there, and its revision stays the same through a release. The chat API names its own
address to the relay in ``X-Chatfleet-Replica`` (only when the request says it comes from the relay), so
this holds through a Service's ClusterIP too (``--balanced``): later turns go to that address directly, and
when it cannot answer, to the next as above (the dialogue then stays where it landed). The client never
sees the address.

A request that is not streamed is sent again to the next replica on the same faults, before any answer
came back. When a replica saved the turn and then died before its answer reached the relay, the session's
history holds that turn twice (the only case that can).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from chatfleet_runtime.relay.replicas import Affinity, Upstreams, dialogue_key, replica_url
from chatfleet_runtime.relay.splice import DONE, Cut, Progress, asked, cut_error, event_data, resume_body, sse

log = logging.getLogger("chatfleet.relay")

CHAT_PATH = "/v1/chat/completions"
#: Asked of the replicas on a streamed request: an SSE comment whenever the next chunk is slow to come, every
#: that many seconds (a quarter of the stall limit), so the stall limit measures silence, not a slow answer.
HEARTBEAT_HEADER = "X-Chatfleet-Heartbeat-Seconds"
#: Sent with every chat request, so that the chat API answers with REPLICA_HEADER (the same names as the chat
#: API's in chat/turn.py: the relay and the chat API share no module).
RELAY_HEADER = "X-Chatfleet-Relay"
#: The address (IP:port) of the replica that answered, from the chat API to the relay: the dialogue's next
#: turns go there. Never passed on to the client.
REPLICA_HEADER = "X-Chatfleet-Replica"
#: Statuses that mean "this replica cannot answer now", tried on the next one.
RETRIED = frozenset({502, 503, 504})
#: Hop-by-hop and framing headers, never passed on (RFC 9110 7.6.1), nor the host.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
        # the relay's own, between it and the chat API: never from the client, never to it
        RELAY_HEADER.lower(),
        REPLICA_HEADER.lower(),
    }
)


def passed_headers(headers) -> dict[str, str]:
    """The headers passed on to the other side (less hop-by-hop, framing, host and the relay's own)."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}


class RelayMetrics:
    """The relay's counters, on their own registry (served on the metrics port only)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.streams = Counter(
            "chatfleet_relay_streams",
            "Streams the relay ended, by outcome: completed ([DONE] sent), cut (the client got the stream_cut "
            "error), client_gone (the client left first), refused (no replica streamed it)",
            ["outcome"],
            registry=self.registry,
        )
        self.resumes = Counter(
            "chatfleet_relay_resumes",
            "Streams continued on another replica, by why the first was cut: closed, stalled, error_event",
            ["reason"],
            registry=self.registry,
        )
        self.resume_gap = Histogram(
            "chatfleet_relay_resume_gap_seconds",
            "The silence a resume cost the client: from the last chunk it got before the cut to the first "
            "text of the replica that continued the answer (a stall's includes the stall limit)",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0),
            registry=self.registry,
        )
        self.retries = Counter(
            "chatfleet_relay_retries",
            "Requests sent again to another replica before any answer (unreachable, 502, 503, 504)",
            registry=self.registry,
        )
        self.affinity = Counter(
            "chatfleet_relay_dialogue_turns",
            "Chat requests of a dialogue a replica answered, by where: kept (the replica of its last turn), "
            "moved (that replica could not answer: another did), new (no replica known: its first turn here)",
            ["placed"],
            registry=self.registry,
        )


class Relay:
    """The relay's requests: one httpx client, the replicas, the limits."""

    def __init__(
        self,
        upstreams: Upstreams,
        *,
        stall_s: float = 15.0,
        max_resumes: int = 3,
        connect_timeout_s: float = 2.0,
        first_byte_s: float | None = None,
        metrics: RelayMetrics | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.upstreams = upstreams
        self.affinity = Affinity()
        self.stall_s = stall_s
        self.max_resumes = max_resumes
        self.metrics = metrics or RelayMetrics()
        # read: a replica that sends no byte for first_byte_s (its answer's head included: the chat API
        # answers within its request timeout, a fallback at worst) is taken as gone and the next is tried
        timeout = httpx.Timeout(
            connect=connect_timeout_s, read=first_byte_s, write=10.0, pool=connect_timeout_s
        )
        self.client = client or httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_keepalive_connections=64)
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def _send(self, url: str, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        request = self.client.build_request("POST", url + path, content=body, headers=headers)
        return await self.client.send(request, stream=True)

    async def _open(
        self, body: bytes, headers: dict[str, str], tried: set[str], dialogue: str | None = None
    ) -> tuple[str, httpx.Response] | Response:
        """The first replica, not yet tried, that answers 200 (the response still streaming), or the
        answer to give the client: another replica's non-retried status, or a 503 when none could. The
        `dialogue`'s replica goes first; the one that answers becomes it."""
        last: Response | None = None
        known = self.affinity.get(dialogue)
        order = await self.upstreams.order(tried, first=known)
        for n, url in enumerate(order):
            if n and self.upstreams.balanced and url == order[n - 1]:  # the balancer again: let a dead
                await asyncio.sleep(self.upstreams.balanced_pause_s)  # replica leave it first
            tried.add(url)
            try:
                resp = await self._send(url, CHAT_PATH, body, headers)
            except httpx.TransportError as exc:
                log.info("replica %s unreachable: %s", url, exc)
                self.upstreams.failed(url)
                self.metrics.retries.inc()
                continue
            if resp.status_code == 200:
                replica = replica_url(resp.headers.get(REPLICA_HEADER))
                self.upstreams.answered(replica)
                if dialogue is not None:
                    self.affinity.put(dialogue, replica)
                    placed = "new" if known is None else "kept" if url == known else "moved"
                    self.metrics.affinity.labels(placed).inc()
                return url, resp
            content = await resp.aread()
            await resp.aclose()
            last = Response(content, resp.status_code, headers=passed_headers(resp.headers))
            if resp.status_code not in RETRIED:
                return last
            self.upstreams.failed(url)
            self.metrics.retries.inc()
        if last is not None:
            return last
        return JSONResponse(
            {"error": {"message": "no chat replica could be reached; retry", "type": "server_error"}},
            503,
            headers={"Retry-After": "1"},
        )

    async def _lines(self, resp: httpx.Response) -> AsyncIterator[str]:
        """The replica's lines, raising Cut after ``stall_s`` without one."""
        lines = resp.aiter_lines().__aiter__()
        while True:
            try:
                line = await asyncio.wait_for(lines.__anext__(), self.stall_s)
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                raise Cut(f"no bytes for {self.stall_s:g} s", "stalled") from exc
            yield line

    async def _splice(
        self,
        body: dict,
        headers: dict[str, str],
        url: str,
        resp: httpx.Response,
        tried: set[str],
        dialogue: str | None,
    ) -> AsyncIterator[str]:
        """The client's stream: the replica's chunks, then another's continuing them after a cut."""
        options = body.get("stream_options")
        progress = Progress(
            continuous_usage=isinstance(options, dict) and options.get("continuous_usage_stats") is True
        )
        outcome = "client_gone"
        last_sent = time.monotonic()
        resumed_at: float | None = None  # when the last chunk before a cut was sent, until text follows
        try:
            while True:
                try:
                    async for line in self._lines(resp):
                        data = event_data(line)
                        if data is None:
                            continue
                        if data == DONE:
                            yield sse(DONE)
                            outcome = "completed"
                            return
                        chunk = progress.rewrite(json.loads(data))
                        if chunk is None:
                            continue
                        last_sent = time.monotonic()
                        if resumed_at is not None and _has_text(chunk):
                            self.metrics.resume_gap.observe(last_sent - resumed_at)
                            resumed_at = None
                        yield sse(chunk)
                    raise Cut("the replica closed the stream before [DONE]", "closed")
                except Cut as exc:
                    reason, why = exc.reason, str(exc)
                except (httpx.TransportError, json.JSONDecodeError) as exc:
                    reason, why = "closed", f"{type(exc).__name__}: {exc}"
                finally:
                    await resp.aclose()
                self.upstreams.failed(url)
                if progress.finished:  # the answer was whole; only [DONE] was lost
                    yield sse(DONE)
                    outcome = "completed"
                    return
                opened: tuple[str, httpx.Response] | Response | None = None
                if progress.resumes < self.max_resumes:
                    again = asked(resume_body(body, progress) if progress.text else body)
                    opened = await self._open(json.dumps(again).encode(), headers, tried, dialogue)
                if not isinstance(opened, tuple):
                    log.warning("stream cut (%s) and not resumed after %d resumes", why, progress.resumes)
                    yield sse(cut_error(f"the answer was cut ({why}) and no replica could continue it"))
                    outcome = "cut"
                    return
                log.info("stream cut at %d tokens (%s): resuming on %s", progress.tokens, why, opened[0])
                self.metrics.resumes.labels(reason).inc()
                progress.begin_resume()
                resumed_at = last_sent if resumed_at is None else resumed_at
                url, resp = opened
        finally:
            self.metrics.streams.labels(outcome).inc()

    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        headers = passed_headers(request.headers)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        streamed = isinstance(body, dict) and body.get("stream") is True
        if streamed:
            headers = {k: v for k, v in headers.items() if k.lower() != HEARTBEAT_HEADER.lower()}
            headers[HEARTBEAT_HEADER] = f"{min(30.0, max(0.1, self.stall_s / 4)):g}"
        headers[RELAY_HEADER] = "1"
        dialogue = dialogue_key(headers, body)
        tried: set[str] = set()
        opened = await self._open(
            json.dumps(asked(body)).encode() if streamed else raw, headers, tried, dialogue
        )
        if not isinstance(opened, tuple):
            if streamed:
                self.metrics.streams.labels("refused").inc()
            return opened
        url, resp = opened
        if not streamed or not resp.headers.get("content-type", "").startswith("text/event-stream"):
            try:
                content = await resp.aread()
            except httpx.TransportError as exc:
                return JSONResponse(
                    {
                        "error": {
                            "message": f"the replica's answer was cut ({exc}); retry",
                            "type": "server_error",
                        }
                    },
                    502,
                )
            finally:
                await resp.aclose()
            return Response(content, resp.status_code, headers=passed_headers(resp.headers))
        out_headers = passed_headers(resp.headers)
        out_headers["Cache-Control"] = "no-cache"
        return StreamingResponse(
            self._splice(body, headers, url, resp, tried, dialogue),
            media_type="text/event-stream",
            headers=out_headers,
        )

    async def get(self, path: str, request: Request) -> Response:
        """A GET passed to the first replica that answers."""
        for url in await self.upstreams.order(set(), advance=False):
            try:
                resp = await self.client.get(url + path, headers=passed_headers(request.headers))
            except httpx.TransportError:
                self.upstreams.failed(url)
                continue
            return Response(resp.content, resp.status_code, headers=passed_headers(resp.headers))
        return JSONResponse({"status": "no chat replica could be reached"}, 503)


def _has_text(chunk: dict) -> bool:
    choices = chunk.get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


def create_app(relay: Relay) -> FastAPI:
    """The relay's routes (end users' only); ``/metrics`` is served on its own port (``main``)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await relay.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.relay = relay

    @app.post(CHAT_PATH)
    async def chat_completions(request: Request):
        return await relay.chat(request)

    @app.get("/v1/models")
    async def models(request: Request):
        return await relay.get("/v1/models", request)

    @app.get("/health")
    async def health(request: Request):
        return await relay.get("/health", request)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chatfleet stream relay")
    parser.add_argument("--upstream", action="append", required=True, help="a chat API replica's base URL")
    parser.add_argument(
        "--resolve", action="store_true", help="use every address each upstream's host resolves to"
    )
    parser.add_argument(
        "--balanced",
        action="store_true",
        help="the one --upstream is a load balancer (a Service's ClusterIP): resume through it again",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--metrics-port", type=int, default=8090, help="GET /metrics for Prometheus, only")
    parser.add_argument("--stall-seconds", type=float, default=15.0, help="a stream silent this long is cut")
    parser.add_argument("--max-resumes", type=int, default=3, help="resumes of one stream at most")
    parser.add_argument(
        "--first-byte-seconds",
        type=float,
        default=90.0,
        help="a replica silent this long before its answer began is taken as gone (above its request timeout)",
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if args.stall_seconds <= 0 or args.max_resumes < 0 or args.first_byte_seconds <= 0:
        parser.error(
            "--stall-seconds, --first-byte-seconds: must be above 0; --max-resumes: must be 0 or more"
        )
    if args.metrics_port == args.port:
        parser.error("--metrics-port: must differ from --port")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.balanced and (len(args.upstream) != 1 or args.resolve):
        parser.error("--balanced takes exactly one --upstream and no --resolve")
    upstreams = Upstreams(
        [u.rstrip("/") for u in args.upstream], resolve=args.resolve, balanced=args.balanced
    )
    relay = Relay(
        upstreams,
        stall_s=args.stall_seconds,
        max_resumes=args.max_resumes,
        first_byte_s=args.first_byte_seconds,
    )
    start_http_server(args.metrics_port, addr=args.host, registry=relay.metrics.registry)
    uvicorn.run(create_app(relay), host=args.host, port=args.port, log_level=args.log_level)
    return 0
