"""The chat API with a fake Triton backend: shapes, bad input, deadline, breaker, fallback, streaming.

Test design: the backend is injected (no Triton, no Redis), so each behaviour is checked in isolation.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from chatfleet_runtime.chat.api import ApiSettings, create_app
from chatfleet_runtime.chat.backend import BackendError, Chunk
from fastapi.testclient import TestClient


class FakeBackend:
    """Answers 'echo: <last user message>' (or fails / hangs as told)."""

    def __init__(self):
        self.mode = "ok"
        self.calls = []

    async def ready(self):
        return True

    async def max_new_tokens(self):
        return 40

    async def close(self):
        pass

    async def complete(self, messages, params, timeout):
        self.calls.append((messages, params))
        if self.mode == "down":
            raise BackendError("unavailable", "connection refused")
        if self.mode == "hang":
            await asyncio.sleep(10)
        if self.mode == "invalid":
            raise BackendError("invalid", "messages: the prompt is 9999 tokens, more than the 100 left")
        if self.mode == "overloaded":
            raise BackendError("overloaded", "kv budget: 8 running requests hold the KV budget; retry later")
        return Chunk(f"echo: {messages[-1]['content']}", "stop", 3, prompt_tokens=7)

    async def stream(self, messages, params, timeout):
        self.calls.append((messages, params))
        if self.mode == "down":
            raise BackendError("unavailable", "connection refused")
        if self.mode == "overloaded":
            raise BackendError("overloaded", "kv budget: 8 running requests hold the KV budget; retry later")
        for n, word in enumerate(("one ", "two ", "three"), 1):
            yield Chunk(word, num_tokens=n, prompt_tokens=7)  # as Triton's: the answer's tokens so far
            if self.mode == "stall":  # the stream stops part-way: the deadline ends it
                await asyncio.sleep(10)
            if self.mode == "cut":  # Triton fails part-way (its process killed, the gRPC stream broken)
                raise BackendError("unavailable", "Socket closed")
        yield Chunk("", "length", 3, prompt_tokens=7)


@pytest.fixture
def backend():
    return FakeBackend()


@pytest.fixture
def client(backend):
    settings = ApiSettings(
        model_name="m1",
        request_timeout_s=0.5,
        breaker_failures=2,
        breaker_reset_s=60,
        max_new_tokens=50,
        faq='[{"keywords": ["refund"], "answer": "FAQ refund"}]',
        fallback_text="busy",
    )
    with TestClient(create_app(settings, backend=backend)) as c:
        yield c


def post(client, body, **kw):
    return client.post(
        "/v1/chat/completions", content=body if isinstance(body, bytes) else json.dumps(body), **kw
    )


U = [{"role": "user", "content": "hello"}]
#: The admin and scrape ports of ApiSettings' defaults; a relative URL goes to the chat port.
ADMIN, METRICS = "http://testserver:8082", "http://testserver:8090"


def test_completion_shape(client):
    r = post(client, {"model": "m1", "messages": U})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello"}
    assert body["usage"]["completion_tokens"] == 3 and body["chatfleet"]["fallback"] is False


def test_models_health_ready_metrics(client):
    assert client.get("/v1/models").json()["data"][0]["id"] == "m1"
    assert client.get(f"{ADMIN}/healthz").status_code == 200
    assert "chatfleet_breaker_state" in client.get(f"{METRICS}/metrics").text


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param(b"{", 400, "body: not valid JSON", id="malformed"),
        pytest.param(b"\xff\xfe", 400, "body: not valid JSON", id="not-utf8"),
        pytest.param(
            {"messages": U, "model": "other"},
            404,
            "model: 'other' is not served here (available: m1)",
            id="model",
        ),
        pytest.param(
            {"messages": [{"role": "robot", "content": "x"}]},
            400,
            "messages[0].role: 'robot' is not one of system, user, assistant",
            id="role",
        ),
        pytest.param(
            {"messages": U, "max_tokens": 51}, 400, "max_tokens: 51 is more than the limit 50", id="tokens"
        ),
        pytest.param(
            {"messages": U, "session_id": "a/b"}, 400, "session_id: must be 1-128 characters", id="session"
        ),
        pytest.param({"messages": U, "n": 2}, 400, "n: only 1 is supported", id="n"),
        pytest.param(
            {"messages": U, "stream": "yes"}, 400, "stream: must be true or false", id="stream-type"
        ),
    ],
)
def test_bad_input(client, backend, body, status, message):
    r = post(client, body)
    assert r.status_code == status and r.json()["error"]["message"].startswith(message)
    assert backend.calls == []


def test_bad_session_header(client):
    r = post(client, {"messages": U}, headers={"X-Session-Id": "x" * 200})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Session-Id"


def test_triton_invalid_request_is_400_and_not_a_breaker_failure(client, backend):
    backend.mode = "invalid"
    for _ in range(3):
        r = post(client, {"messages": U})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages: the prompt is")
    assert client.app.state.breaker.state == "closed"


def test_deadline_then_breaker_opens_and_serves_faq(client, backend):
    backend.mode = "hang"
    r = post(client, {"messages": U})
    assert r.json()["chatfleet"]["reason"] == "timeout" and r.headers["x-chatfleet-fallback"] == "text"
    backend.mode = "down"
    r = post(client, {"messages": [{"role": "user", "content": "refund please"}]})
    assert r.json()["choices"][0]["message"]["content"] == "FAQ refund"
    assert client.app.state.breaker.state == "open"
    calls = len(backend.calls)
    r = post(client, {"messages": U})
    assert r.json()["chatfleet"]["reason"] == "circuit_open" and len(backend.calls) == calls


def test_stream_events(client):
    with client.stream(
        "POST", "/v1/chat/completions", content=json.dumps({"messages": U, "stream": True})
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "one two three"
    assert (
        events[-1]["choices"][0]["finish_reason"] == "length"
        and events[-1]["usage"]["completion_tokens"] == 3
    )


def test_stream_fallback_when_down(client, backend):
    backend.mode = "down"
    r = post(client, {"messages": U, "stream": True})
    assert (
        r.headers["x-chatfleet-fallback"] == "text"
        and "busy" in r.text
        and r.text.endswith("data: [DONE]\n\n")
    )


def test_session_without_redis_is_served(client, backend):
    r = post(client, {"messages": U, "session_id": "conv-1"})
    assert r.status_code == 200 and r.json()["chatfleet"]["session_id"] == "conv-1"
    assert backend.calls[-1][1]["session_id"] == "conv-1"


def test_settings_from_env():
    s = ApiSettings.from_env(
        {
            "CHATFLEET_MODEL_NAME": "bot",
            "CHATFLEET_HISTORY_TURNS": "3",
            "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "2.5",
        }
    )
    assert (s.model_name, s.history_turns, s.request_timeout_s) == ("bot", 3, 2.5)


def test_token_limit_comes_from_triton_when_not_set(backend):
    with TestClient(create_app(ApiSettings(model_name="m1"), backend=backend)) as c:
        for _ in range(50):
            if c.get(f"{ADMIN}/readyz").status_code == 200:
                break
        r = post(c, {"messages": U, "max_tokens": 41})
        assert (
            r.status_code == 400
            and r.json()["error"]["message"] == "max_tokens: 41 is more than the limit 40"
        )


# ---- OpenAI compatibility: user as session key, usage, per-field policy ------------------------------


def test_user_that_is_an_email_is_accepted_and_hashed_into_a_session_key(client, backend):
    r = post(client, {"messages": U, "user": "alice@example.com"})
    assert r.status_code == 200, r.text
    sid = r.json()["chatfleet"]["session_id"]
    assert sid.startswith("user-") and "alice" not in sid
    assert backend.calls[-1][1]["session_id"] == sid
    again = post(client, {"messages": U, "user": "alice@example.com"}).json()["chatfleet"]["session_id"]
    other = post(client, {"messages": U, "user": "bob@example.com"}).json()["chatfleet"]["session_id"]
    assert again == sid != other


def test_user_must_be_a_string(client):
    r = post(client, {"messages": U, "user": 42})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("user: must be a string")


def test_usage_has_prompt_tokens(client):
    usage = post(client, {"messages": U}).json()["usage"]
    assert usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_stream_usage_has_prompt_tokens(client):
    with client.stream(
        "POST", "/v1/chat/completions", content=json.dumps({"messages": U, "stream": True})
    ) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert events[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def metric(client, name, **labels):
    total = 0.0
    for line in client.get(f"{METRICS}/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rpartition(" ")[2])
    return total


def test_stream_that_times_out_part_way_is_an_error_in_the_metrics(client, backend):
    backend.mode = "stall"
    with client.stream(
        "POST", "/v1/chat/completions", content=json.dumps({"messages": U, "stream": True})
    ) as r:
        text = r.read().decode()
    assert text.endswith("data: [DONE]\n\n")
    assert metric(client, "chatfleet_requests_total", outcome="error", stream="true") == 1
    assert metric(client, "chatfleet_requests_total", outcome="success") == 0


def test_stream_cut_short_by_the_deadline_reports_the_tokens_it_sent(client, backend):
    """The deadline ends the answer after its first chunk ("length"): the last chunk's usage counts that
    chunk's token (a stream relay adds it to the tokens of the replica before), and so do the metrics."""
    backend.mode = "stall"
    body = {"messages": U, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", content=json.dumps(body)) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == "one "
    finish = next(e for e in events if e["choices"] and e["choices"][0]["finish_reason"])
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["usage"] == {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
    assert metric(client, "chatfleet_generated_tokens_total") == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools: tool calling is not supported",
            id="tools",
        ),
        pytest.param(
            {"tool_choice": "required"}, "tool_choice: tool calling is not supported", id="tool-choice"
        ),
        pytest.param(
            {"functions": [{"name": "f"}]}, "functions: tool calling is not supported", id="functions"
        ),
        pytest.param({"function_call": "auto"}, "function_call: tool calling is not supported", id="fn-call"),
        pytest.param(
            {"response_format": {"type": "json_object"}},
            'response_format: only {"type": "text"} is supported',
            id="response-format",
        ),
        pytest.param(
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            'response_format: only {"type": "text"} is supported',
            id="json-schema",
        ),
        pytest.param({"logprobs": True}, "logprobs: not supported", id="logprobs"),
        pytest.param({"top_logprobs": 2}, "top_logprobs: not supported", id="top-logprobs"),
        pytest.param({"modalities": ["audio"]}, 'modalities: only ["text"] is supported', id="modalities"),
        pytest.param({"audio": {"voice": "x"}}, "audio: not supported", id="audio"),
        pytest.param({"prediction": {"type": "content"}}, "prediction: not supported", id="prediction"),
        pytest.param({"presence_penalty": 2.5}, "presence_penalty: 2.5 is outside -2.0..2.0", id="presence"),
        pytest.param({"frequency_penalty": "x"}, "frequency_penalty: must be a number", id="frequency"),
        pytest.param({"logit_bias": {"abc": 1}}, "logit_bias: keys must be token ids", id="bias-key"),
        pytest.param({"logit_bias": {"5": 101}}, "logit_bias[5]: 101 is outside -100..100", id="bias-value"),
        pytest.param({"seed": 2**64}, "seed: 18446744073709551616 is outside", id="seed"),
        pytest.param({"temperature": 2.5}, "temperature: 2.5 is outside", id="temperature"),
        pytest.param({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", id="so"),
    ],
)
def test_unsupported_or_out_of_range_fields_are_refused_naming_the_field(client, backend, extra, message):
    r = post(client, {"messages": U, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith(message), error
    assert error["param"] == message.split(":")[0]
    assert backend.calls == []


@pytest.mark.parametrize(
    ("extra", "sent"),
    [
        pytest.param({"presence_penalty": 0.5}, {"presence_penalty": 0.5}, id="presence"),
        pytest.param({"frequency_penalty": -1}, {"frequency_penalty": -1.0}, id="frequency"),
        pytest.param({"logit_bias": {"5": -100, "9": 3}}, {"logit_bias": {"5": -100.0, "9": 3.0}}, id="bias"),
        pytest.param({"tool_choice": "none"}, {}, id="tool-choice-none"),
        pytest.param({"tools": []}, {}, id="no-tools"),
        pytest.param({"response_format": {"type": "text"}}, {}, id="text-format"),
        pytest.param({"logprobs": False}, {}, id="logprobs-false"),
        pytest.param({"stream_options": {"include_usage": True}}, {}, id="stream-options"),
        pytest.param({"metadata": {"a": "b"}, "store": False, "service_tier": "auto"}, {}, id="bookkeeping"),
        pytest.param({"parallel_tool_calls": False}, {}, id="parallel-tool-calls"),
    ],
)
def test_supported_fields_reach_the_model(client, backend, extra, sent):
    r = post(client, {"messages": U, **extra})
    assert r.status_code == 200, r.text
    params = backend.calls[-1][1]
    assert {k: params[k] for k in sent} == sent
    assert "ignored_fields" not in r.json()["chatfleet"]


def test_unknown_fields_are_ignored_but_named_in_the_response(client, backend):
    r = post(client, {"messages": U, "best_of": 3, "guided_json": {}})
    assert r.status_code == 200
    assert r.json()["chatfleet"]["ignored_fields"] == ["best_of", "guided_json"]


# ---- Track echo: every response names the answering pod's track and revision ----------------------


@pytest.fixture
def canary_client(backend):
    settings = ApiSettings(model_name="m1", request_timeout_s=0.5, track="canary", revision="5f9c2a1b")
    with TestClient(create_app(settings, backend=backend)) as c:
        yield c


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("POST", "/v1/chat/completions", {"messages": U}, id="completion"),
        pytest.param("POST", "/v1/chat/completions", {"messages": U, "stream": True}, id="stream"),
        pytest.param("POST", "/v1/chat/completions", {"messages": []}, id="error-400"),
        pytest.param("POST", "/v1/chat/completions", {"messages": U, "model": "x"}, id="error-404"),
        pytest.param("GET", "/v1/models", None, id="models"),
        pytest.param("GET", f"{ADMIN}/healthz", None, id="healthz"),
        pytest.param("GET", f"{ADMIN}/readyz", None, id="readyz"),
        pytest.param("GET", f"{METRICS}/metrics", None, id="metrics"),
    ],
)
def test_every_response_names_track_and_revision(canary_client, method, path, body):
    r = canary_client.request(method, path, content=json.dumps(body) if body is not None else None)
    assert r.headers["x-chatfleet-track"] == "canary"
    assert r.headers["x-chatfleet-revision"] == "5f9c2a1b"


def test_fallback_response_names_the_track(canary_client, backend):
    backend.mode = "down"
    for stream in (False, True):
        r = post(canary_client, {"messages": U, "stream": stream})
        assert r.headers["x-chatfleet-fallback"] == "text" and r.headers["x-chatfleet-track"] == "canary"


def test_track_and_revision_come_from_the_pod_env():
    s = ApiSettings.from_env({"CHATFLEET_TRACK": "stable", "CHATFLEET_REVISION": "abc"})
    assert (s.track, s.revision) == ("stable", "abc")


def test_no_track_header_when_the_pod_does_not_know_it(client):
    assert "x-chatfleet-track" not in post(client, {"messages": U}).headers


# ---- One scrape endpoint: the chat API re-exports Triton's metrics ------------------------------------


@pytest.fixture
def fake_triton_metrics():
    """A real HTTP server on 127.0.0.1 serving a Triton-like exposition page."""
    import http.server
    import threading

    page = b'# HELP nv_inference_count Number of inferences\n# TYPE nv_inference_count counter\nnv_inference_count{model="chat",version="1"} 5\n'

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_metrics_re_export_triton(backend, fake_triton_metrics):
    from prometheus_client.parser import text_string_to_metric_families

    settings = ApiSettings(model_name="m1", triton_metrics_url=fake_triton_metrics)
    with TestClient(create_app(settings, backend=backend)) as c:
        text = c.get(f"{METRICS}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}  # one valid exposition
    assert families["nv_inference_count"].samples[0].value == 5
    assert "chatfleet_requests" in families
    assert families["chatfleet_triton_metrics_up"].samples[0].value == 1


def test_scrapes_reuse_one_client_of_tritons_metrics(backend, fake_triton_metrics, monkeypatch):
    """Making an httpx client loads the CA bundle (about 0.1-0.3 s of CPU on the event loop that also
    answers the kubelet's probes): one per process, not one per scrape."""
    import httpx

    made = []
    real = httpx.AsyncClient

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", counted)
    settings = ApiSettings(model_name="m1", triton_metrics_url=fake_triton_metrics)
    with TestClient(create_app(settings, backend=backend)) as c:
        for _ in range(3):
            assert "nv_inference_count" in c.get(f"{METRICS}/metrics").text
    assert len(made) == 1


def test_metrics_still_answer_when_triton_is_unreachable(backend):
    from chatfleet_runtime.launcher.tritonhome import free_port

    settings = ApiSettings(model_name="m1", triton_metrics_url=f"http://127.0.0.1:{free_port()}/metrics")
    with TestClient(create_app(settings, backend=backend)) as c:
        r = c.get(f"{METRICS}/metrics")
    assert r.status_code == 200 and 'chatfleet_triton_metrics_up{model="m1"} 0.0' in r.text


def test_the_pipeline_answers_without_http(backend):
    """ChatPipeline is plain Python: a reply (body or events) for raw bytes and headers, no app needed."""
    from chatfleet_runtime.chat.pipeline import ChatPipeline

    async def run():
        pipeline = ChatPipeline(ApiSettings(model_name="m1", max_new_tokens=50), backend)
        reply = await pipeline.chat(json.dumps({"messages": U}).encode(), {"x-session-id": "s-1"})
        stream = await pipeline.chat(json.dumps({"messages": U, "stream": True}).encode(), {})
        events = [e async for e in stream.events]
        bad = await pipeline.chat(b'{"messages": []}', {})
        return pipeline, reply, events, bad

    pipeline, reply, events, bad = asyncio.run(run())
    assert reply.status == 200 and reply.events is None
    assert reply.body["choices"][0]["message"]["content"] == "echo: hello"
    assert reply.body["chatfleet"]["session_id"] == "s-1"
    assert events[-1] == "data: [DONE]\n\n" and json.loads(events[1][6:])["choices"][0]["delta"] == {
        "content": "one "
    }
    assert bad.status == 400 and bad.body["error"]["param"] == "messages"
    assert pipeline.inflight == 0


def test_the_models_bad_request_error_reads_as_the_clients_fault_in_the_api():
    from chatfleet_runtime.chat.backend import _classify
    from chatfleet_runtime.engine.service import error_message

    err = _classify(
        Exception(f"[StatusCode.INTERNAL] {error_message('invalid', 'messages: must not be empty')}")
    )
    assert (err.kind, str(err)) == ("invalid", "messages: must not be empty")
    assert _classify(Exception(error_message("internal", "generate failed: boom"))).kind == "error"


def test_the_models_overloaded_error_reads_as_overloaded_in_the_api():
    from chatfleet_runtime.chat.backend import _classify
    from chatfleet_runtime.engine.service import error_message

    err = _classify(Exception(f"[StatusCode.INTERNAL] {error_message('overloaded', 'kv budget: full')}"))
    assert (err.kind, str(err)) == ("overloaded", "kv budget: full")


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_kv_budget_is_429_with_retry_after_and_not_a_breaker_failure(client, backend, stream):
    backend.mode = "overloaded"
    for _ in range(3):
        r = post(client, {"messages": U, "stream": stream})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded" and "kv budget" in r.json()["error"]["message"]
    assert client.app.state.breaker.state == "closed"


# ---- one model: spec.runtime.streaming, and what the backend asks Triton ------------------------------


def test_streaming_off_refuses_stream_true_with_a_400_naming_stream(backend):
    """spec.runtime.streaming: false (CHATFLEET_STREAMING=false): `stream: true` is the client's fault,
    OpenAI-shaped and naming the field; `stream: false` is served as usual."""
    settings = ApiSettings.from_env({"CHATFLEET_STREAMING": "false"}, model_name="m1", max_new_tokens=50)
    assert settings.streaming is False and ApiSettings.from_env({}).streaming is True
    with TestClient(create_app(settings, backend=backend)) as c:
        r = post(c, {"messages": U, "stream": True})
        error = r.json()["error"]
        assert r.status_code == 400 and (error["param"], error["type"]) == ("stream", "invalid_request_error")
        assert "spec.runtime.streaming: false" in error["message"] and backend.calls == []
        assert metric(c, "chatfleet_requests_total", outcome="client_error", stream="true") == 1
        assert post(c, {"messages": U, "stream": False}).status_code == 200
        assert c.app.state.breaker.state == "closed"


class FakeGrpc:
    """tritonclient.grpc.aio's client as TritonChat uses it: records what is asked of which model."""

    def __init__(self):
        self.asked: list[tuple[str, str, dict]] = []

    async def is_model_ready(self, name):
        self.asked.append(("ready", name, {}))
        return True

    async def get_model_config(self, name, as_json=False):
        self.asked.append(("config", name, {}))
        return {"config": {"parameters": {"max_new_tokens": {"string_value": "77"}}}}

    async def infer(self, name, inputs, client_timeout=None):
        raise AssertionError(f"unary infer on {name!r}: the one model is decoupled, streams only")

    def stream_infer(self, requests, stream_timeout=None):
        return _FakeCall(self, requests)

    async def close(self):
        pass


class _FakeCall:
    """One gRPC stream: a delta unless `stream: false`, then the final response."""

    def __init__(self, grpc: FakeGrpc, requests):
        self.grpc, self.requests = grpc, requests

    def cancel(self):
        pass

    async def __aiter__(self):
        from tritonclient.utils import deserialize_bytes_tensor

        async for request in self.requests:
            (params,) = [i for i in request["inputs"] if i.name() == "PARAMETERS"]
            sent = json.loads(deserialize_bytes_tensor(params._get_content())[0])
            self.grpc.asked.append(("stream", request["model_name"], sent))
        if sent.get("stream", True):
            yield _Result("hi", ""), None
        yield _Result("" if sent.get("stream", True) else "hi", "stop"), None


class _Result:
    """A Triton result with the chat model's four outputs."""

    def __init__(self, text: str, finish: str):
        import numpy as np

        self.arrays = {
            "TEXT": np.array([text.encode()], dtype=np.object_),
            "FINISH_REASON": np.array([finish.encode()], dtype=np.object_),
            "NUM_TOKENS": np.array([1], dtype=np.int32),
            "PROMPT_TOKENS": np.array([2], dtype=np.int32),
        }

    def as_numpy(self, name):
        return self.arrays.get(name)


def test_the_backend_asks_one_model_for_everything():
    """Readiness, the max_new_tokens lookup, streamed and non-streamed completions: all on `chat`, the
    one decoupled model; a non-streamed completion is `stream: false` on the same gRPC stream API."""
    from chatfleet_contract.tritonconfig import MODEL_NAME
    from chatfleet_runtime.chat.backend import TritonChat

    async def run():
        chat = TritonChat("127.0.0.1:1")
        chat._client = grpc = FakeGrpc()
        ready, limit = await chat.ready(), await chat.max_new_tokens()
        done = await chat.complete(U, {"max_tokens": 4}, 5.0)
        chunks = [c async for c in chat.stream(U, {"max_tokens": 4}, 5.0)]
        return grpc.asked, ready, limit, done, chunks

    asked, ready, limit, done, chunks = asyncio.run(run())
    assert (ready, limit, done.text, done.finish_reason) == (True, 77, "hi", "stop")
    assert [c.text for c in chunks] == ["hi", ""] and chunks[-1].finish_reason == "stop"
    assert {name for _, name, _ in asked} == {MODEL_NAME} == {"chat"}
    assert [(kind, sent.get("stream")) for kind, _, sent in asked] == [
        ("ready", None),
        ("config", None),
        ("stream", False),
        ("stream", None),
    ]


def test_sigusr1_writes_every_threads_stack_to_stderr_and_the_process_goes_on():
    """What a failing real-pod test asks a chat API that stopped answering: where its threads are."""
    import subprocess
    import sys

    code = (
        "import os, signal, threading, time\n"
        "from chatfleet_runtime.chat.api import install_stack_dump\n"
        "install_stack_dump()\n"
        "def stuck_in_a_helper():\n"
        "    time.sleep(3)\n"
        "threading.Thread(target=stuck_in_a_helper, daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.2)\n"
        "print('still here')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still here"
    assert "stuck_in_a_helper" in done.stderr and "Current thread" in done.stderr, done.stderr
