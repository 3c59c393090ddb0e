"""The chat API with a fake Triton backend: shapes, bad input, deadline, breaker, fallback, streaming.

Test design: the backend is injected (no Triton, no Redis), so each behaviour is checked in isolation.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from chatfleet_runtime.api import ApiSettings, BackendError, Chunk, create_app
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
        return Chunk(f"echo: {messages[-1]['content']}", "stop", 3)

    async def stream(self, messages, params, timeout):
        self.calls.append((messages, params))
        if self.mode == "down":
            raise BackendError("unavailable", "connection refused")
        for word in ("one ", "two ", "three"):
            yield Chunk(word)
        yield Chunk("", "length", 3)


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


def test_completion_shape(client):
    r = post(client, {"model": "m1", "messages": U})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello"}
    assert body["usage"]["completion_tokens"] == 3 and body["chatfleet"]["fallback"] is False


def test_models_health_ready_metrics(client):
    assert client.get("/v1/models").json()["data"][0]["id"] == "m1"
    assert client.get("/healthz").status_code == 200
    assert "chatfleet_breaker_state" in client.get("/metrics").text


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
            {"messages": U, "user": "a/b"}, 400, "user: must be 1-128 characters", id="bad-user-as-session"
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
            if c.get("/readyz").status_code == 200:
                break
        r = post(c, {"messages": U, "max_tokens": 41})
        assert (
            r.status_code == 400
            and r.json()["error"]["message"] == "max_tokens: 41 is more than the limit 40"
        )
