"""The chat API's OpenTelemetry spans, exported over real OTLP/HTTP to a real (minimal) collector.

Test design: the chat API app with a fake Triton backend runs in a real uvicorn server on 127.0.0.1, with
the OTEL_* environment the operator gives the pod (spec.observability.tracing) pointing at `Collector`, an
http.server thread that accepts POST /v1/traces and decodes each body as an ExportTraceServiceRequest with
opentelemetry-proto's classes. Requests go over HTTP (one JSON answer continuing a given traceparent, a
stream, a stream the client leaves, a fallback, an answer-cache hit, a bad body); stopping the server runs
the app's shutdown, which must flush the spans; then the received spans are read. No prompt, answer,
session id or user may appear in any byte sent. Without the environment nothing of the SDK is loaded; with
a collector that refuses connections or never answers, answers must not wait for it. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from chatfleet_runtime.chat.api import ApiSettings, create_app
from chatfleet_runtime.chat.backend import BackendError, Chunk
from chatfleet_runtime.chat.tracing import NO_TRACE, NO_TRACING, Tracing
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

#: In every prompt (and so in the fake's echoed answers): must never leave the pod in a span.
SECRET = "PRIVATE-PROMPT-7f3a91"
USER = "alice@example.com"
SESSION = "session-4b1d"
TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class FakeBackend:
    """Echoes the last user message (JSON) or streams three words; `mode` down fails, slow streams on."""

    def __init__(self) -> None:
        self.mode = "ok"

    async def ready(self):
        return True

    async def close(self):
        pass

    async def complete(self, messages, params, timeout):
        if self.mode == "down":
            raise BackendError("unavailable", "connection refused")
        return Chunk(f"echo: {messages[-1]['content']}", "stop", 3, prompt_tokens=7)

    async def stream(self, messages, params, timeout):
        if self.mode == "down":
            raise BackendError("unavailable", "connection refused")
        if self.mode == "slow":  # a long answer: the client leaves part-way
            for i in range(400):
                yield Chunk(f"{SECRET} {i} ")
                await asyncio.sleep(0.01)
        for word in (f"echo: {SECRET} ", "two ", "three"):
            yield Chunk(word)
        yield Chunk("", "length", 3, prompt_tokens=7)


class Collector:
    """A minimal OTLP/HTTP receiver: POST /v1/traces with a protobuf ExportTraceServiceRequest, 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.requests: list[ExportTraceServiceRequest] = []
        self.refused: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                kind = self.headers.get("Content-Type")
                if self.path != "/v1/traces" or kind != "application/x-protobuf":
                    outer.refused.append(f"{self.path} {kind}")
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                outer.bodies.append(body)
                outer.requests.append(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """(resource attributes, span) of every span received."""
        return [
            (attributes(rs.resource.attributes), span)
            for request in self.requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]


def value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


def attributes(kvs) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


def otel_env(monkeypatch, endpoint: str, **extra: str) -> None:
    """The pod's OTEL_* environment as the operator writes it (resource attributes expanded)."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    env = {
        "OTEL_SERVICE_NAME": "bot",
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=support,chatfleet.track=stable,chatfleet.revision=r1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1",  # every new trace: the test reads them all
        **extra,
    }
    for name, v in env.items():
        monkeypatch.setenv(name, v)


def settings(**extra: Any) -> ApiSettings:
    return ApiSettings(
        model_name="bot", track="stable", revision="r1", max_new_tokens=50, request_timeout_s=5, **extra
    )


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """The app in a real uvicorn server on 127.0.0.1 (its lifespan included); stopping it runs the app's
    shutdown (the spans' flush), which must end within 15 s."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the chat API did not start within 15 s"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "the chat API did not stop within 15 s"


def chat(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=10)


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "bot", "messages": [{"role": "user", "content": f"{text} {SECRET}"}], **extra}


def leave_mid_stream(url: str) -> None:
    """A stream the client reads two events of, then closes."""
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=ask("long", stream=True)) as resp,
    ):
        lines = resp.iter_lines()
        assert SECRET not in next(lines)  # the role chunk
        next(lines)
        next(lines)


def test_every_chat_request_is_one_genai_span_at_the_collector(monkeypatch):
    backend = FakeBackend()
    with Collector() as collector:
        otel_env(monkeypatch, collector.url)
        # FastAPI's own telemetry would add HTTP spans (and logs with exception messages): it stays off
        monkeypatch.setenv("FASTAPI_OTEL_AUTO_CONFIGURE", "true")
        app = create_app(settings(answer_cache=True), backend=backend)
        assert isinstance(app.state.pipeline.tracing, Tracing)
        with serving(app) as url:
            one = chat(
                url,
                ask("json", max_tokens=20, temperature=0.5, seed=3, user=USER),
                traceparent=TRACEPARENT,
            )
            assert one.status_code == 200 and SECRET in one.json()["choices"][0]["message"]["content"]
            streamed = chat(url, ask("stream", stream=True), **{"X-Session-Id": SESSION})
            assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
            for _ in range(2):  # the second from the answer cache (a greedy first turn)
                assert chat(url, ask("cached", temperature=0)).status_code == 200
            backend.mode = "down"
            assert chat(url, ask("down")).json()["chatfleet"]["reason"] == "unavailable"
            backend.mode = "slow"
            leave_mid_stream(url)
            assert httpx.post(f"{url}/v1/chat/completions", content=b"{", timeout=10).status_code == 400
            # the abandoned stream: the server finds the client gone at its next write and closes it
            registry = app.state.metrics.registry
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if registry.get_sample_value("chatfleet_client_disconnects_total", {"model": "bot"}):
                    break
                time.sleep(0.05)
        # the server stopped: the app's shutdown flushed every span (nothing sent after it)
        assert collector.refused == []
        spans = collector.spans()

    assert len(spans) == 7, [s.name for _, s in spans]
    sent = b"".join(collector.bodies)
    for private in (SECRET, "echo:", "two three", USER, SESSION):
        assert private.encode() not in sent, private
    resource, _ = spans[0]
    assert {k: resource[k] for k in ("service.name", "k8s.namespace.name")} == {
        "service.name": "bot",
        "k8s.namespace.name": "support",
    }
    assert (resource["chatfleet.track"], resource["chatfleet.revision"]) == ("stable", "r1")
    by_kind = {}
    for _, span in spans:
        a = attributes(span.attributes)
        assert span.name == "chat bot" and span.kind == Span.SPAN_KIND_SERVER
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "chatfleet"
        assert (a["chatfleet.track"], a["chatfleet.revision"]) == ("stable", "r1")
        by_kind.setdefault(
            a.get("error.type") or ("stream" if a.get("gen_ai.request.stream") else "json"), []
        ).append((span, a))

    ((span, a),) = [
        (s, a) for s, a in by_kind["json"] if a["gen_ai.request.max_tokens"] == 20
    ]  # the one that came with a traceparent: the caller's trace goes on
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert span.status.code == Status.STATUS_CODE_UNSET
    assert {k: a[k] for k in a if k.startswith(("gen_ai.request", "gen_ai.response", "gen_ai.usage"))} == {
        "gen_ai.request.model": "bot",
        "gen_ai.request.max_tokens": 20,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.seed": 3,
        "gen_ai.request.stream": False,
        "gen_ai.response.model": "bot",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
    }
    assert a["http.response.status_code"] == 200 and a["chatfleet.cache_hit"] is False
    assert "chatfleet.fallback" not in a and "error.type" not in a

    ((span, a),) = by_kind["stream"]
    assert span.trace_id.hex() != TRACE_ID and not span.parent_span_id  # a new trace, sampled by ratio 1
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (7, 3)
    ttft = a["gen_ai.response.time_to_first_chunk"]
    assert 0 < ttft < (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9

    cached = sorted(
        a["chatfleet.cache_hit"] for s, a in by_kind["json"] if a["gen_ai.request.max_tokens"] == 50
    )
    assert cached == [False, True]

    ((span, a),) = by_kind["fallback_unavailable"]
    assert a["chatfleet.fallback"] == "unavailable" and span.status.code == Status.STATUS_CODE_ERROR
    assert "gen_ai.usage.output_tokens" not in a  # the model did not answer

    ((span, a),) = by_kind["client_disconnected"]  # ended when the client left, long before the answer
    assert a["gen_ai.request.stream"] is True and span.status.code == Status.STATUS_CODE_UNSET
    assert (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 < 3.0

    ((span, a),) = by_kind["400"]  # refused before the model: the client's error
    assert a["http.response.status_code"] == 400 and span.status.code == Status.STATUS_CODE_UNSET
    assert "gen_ai.request.model" not in a


@pytest.mark.parametrize("collector", ["refuses", "never-answers", "unresolvable"])
def test_a_collector_that_is_not_there_does_not_slow_the_answers(monkeypatch, collector):
    """Refused connections, a collector that accepts and never answers, a name no DNS knows (a pod of
    examples/04-full.yaml where no collector runs): no answer waits on the exporter. Each export is held
    until every answer has come (an answer that waited on one would time out), then goes to the collector
    that is not there; the app's shutdown still ends."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    accepted: list[socket.socket] = []
    if collector == "never-answers":  # connections accepted, requests read by no one

        def accept() -> None:
            with contextlib.suppress(OSError):
                while True:
                    accepted.append(listener.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
    else:
        listener.close()  # nothing listens: every connection is refused
        if collector == "unresolvable":
            endpoint = "http://otel-collector.monitoring.invalid:4318"
    exporting, release = threading.Event(), threading.Event()
    export = OTLPSpanExporter.export

    def held(self, spans):
        exporting.set()
        release.wait(60)
        return export(self, spans)

    monkeypatch.setattr(OTLPSpanExporter, "export", held)
    # a short batch delay: the exporter works while the requests are being answered
    otel_env(monkeypatch, endpoint, OTEL_BSP_SCHEDULE_DELAY="20", OTEL_EXPORTER_OTLP_TIMEOUT="3")
    app = create_app(settings(), backend=FakeBackend())
    assert isinstance(app.state.pipeline.tracing, Tracing)
    try:
        with serving(app) as url:
            for i in range(12):  # chat()'s own timeout (10 s) ends an answer that waits on the held export
                assert chat(url, ask(f"q{i}", stream=bool(i % 2))).status_code == 200
                time.sleep(0.05)
            assert exporting.wait(10), "no export began while the answers came: the test proved nothing"
            release.set()
            t_stop = time.monotonic()
        stopped_in = time.monotonic() - t_stop
    finally:
        release.set()
        with contextlib.suppress(OSError):
            listener.close()
        for conn in accepted:
            conn.close()
    assert stopped_in < 10, stopped_in  # a bound on a hang: the app's shutdown gives the last spans 2 s
    if collector == "never-answers":
        assert accepted, "the exporter never tried the collector: the test proved nothing"


def test_without_the_environment_nothing_is_traced_and_the_sdk_is_never_loaded(monkeypatch):
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    app = create_app(settings(), backend=FakeBackend())
    assert app.state.pipeline.tracing is NO_TRACING
    assert app.state.pipeline.tracing.begin({"traceparent": TRACEPARENT}) is NO_TRACE
    with TestClient(app) as client:
        reply = client.post("/v1/chat/completions", json=ask("plain"), headers={"traceparent": TRACEPARENT})
        assert reply.status_code == 200

    probe = (
        "import sys\n"
        "from chatfleet_runtime.chat.api import ApiSettings, create_app\n"
        "class B:\n"
        "    async def ready(self): return True\n"
        "create_app(ApiSettings(), backend=B())\n"
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith(('opentelemetry.sdk', "
        "'opentelemetry.exporter'))}))\n"
    )

    def loaded(extra: dict[str, str]) -> list[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env |= {"PYTHONPATH": os.pathsep.join(sys.path), **extra}
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().replace("'", '"'))

    assert loaded({}) == []
    assert loaded({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}) == [
        "exporter",
        "sdk",
    ]  # the probe works
