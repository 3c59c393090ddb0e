"""Shadow traffic (a canary's release gate): mirrored chat requests on the shadow port, their records.

Test design: the app runs with the fake backend of test_runtime_chat_api and the fake Redis of
test_runtime_sessions; a request goes to the shadow port by its URL's port (TestClient and httpx's ASGI
transport put it in the scope's ``server``, as uvicorn does for the socket a request came in on). The
concurrency bound needs requests in flight at once, so that test drives the app through httpx's ASGI
transport with a backend that waits on a gate. The record ring is pure, tested as a table. One test runs
the real server process on two real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import doctest
import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from chatfleet_runtime.chat import api, pipeline, shadow
from chatfleet_runtime.chat.api import ApiSettings, create_app
from chatfleet_runtime.chat.shadow import RECORDS_LIMIT, Shadow
from chatfleet_runtime.launcher.tritonhome import free_port
from fastapi.testclient import TestClient
from test_runtime_chat_api import FakeBackend, U, metric
from test_runtime_drain import Clock, wait_until
from test_runtime_sessions import FakeRedis

SHADOW_PORT = 8081
SHADOW = f"http://testserver:{SHADOW_PORT}"
#: ApiSettings' admin port (probes, drain, the records); LOOPBACK: a client on the pod itself.
ADMIN, LOOPBACK = "http://testserver:8082", ("127.0.0.1", 50000)
HISTORY = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "before"}]


def settings(**kw) -> ApiSettings:
    base = {
        "model_name": "m1",
        "request_timeout_s": 0.5,
        "breaker_failures": 5,
        "breaker_reset_s": 60,
        "max_new_tokens": 50,
        "fallback_text": "busy",
        "drain_settle_s": 5,
        "drain_grace_s": 30,
        "history_turns": 5,
        "shadow_port": SHADOW_PORT,
        "shadow_max_tokens": 8,
        "track": "canary",
    }
    return ApiSettings(**{**base, **kw})


class Backend(FakeBackend):
    """The fake backend, plus: mode "boom" raises a bug (not a BackendError)."""

    async def complete(self, messages, params, timeout):
        if self.mode == "boom":
            raise RuntimeError("boom")
        return await super().complete(messages, params, timeout)


@pytest.fixture
def backend():
    return Backend()


@pytest.fixture
def redis():
    """A fake Redis holding one earlier turn of the conversation conv-1."""
    r = FakeRedis()
    turn = {"messages": HISTORY[:1], "reply": HISTORY[1]["content"], "at": 1.0, "revision": "stable1"}
    r.lists["chatfleet:session:m1:conv-1"] = [json.dumps(turn)]
    return r


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def client(backend, redis, clock):
    """One client for every port: a relative URL goes to the chat port (80), SHADOW + path to the shadow
    port, ADMIN + path to the admin port; from the pod's loopback, so the drain is allowed."""
    app = create_app(settings(), backend=backend, redis_client=redis, clock=clock)
    with TestClient(app, client=LOOPBACK) as c:
        yield c


def mirror(client, body, **kw):
    return client.post(f"{SHADOW}/v1/chat/completions", content=json.dumps(body), **kw)


def take(client):
    r = client.post(f"{ADMIN}/shadow/records")
    assert r.status_code == 200, r.text
    return r.json()


# ---- greedy, capped, never streamed --------------------------------------------------------------------

SAMPLING = {
    "temperature": 1.5,
    "seed": 7,
    "top_p": 0.5,
    "stop": ["x"],
    "presence_penalty": 1,
    "frequency_penalty": 1,
    "logit_bias": {"5": 3},
}
GREEDY = {
    "temperature": 0.0,
    "seed": 0,
    "top_p": 1.0,
    "stop": [],
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": {},
}


@pytest.mark.parametrize(
    ("extra", "max_tokens"),
    [
        pytest.param({"max_tokens": 50, **SAMPLING}, 8, id="capped-and-greedy"),
        pytest.param({"max_tokens": 3}, 3, id="under-the-cap"),
        pytest.param({}, 8, id="no-max-tokens"),
        pytest.param({"stream": True, "max_completion_tokens": 40}, 8, id="stream-answered-whole"),
    ],
)
def test_a_mirror_is_answered_greedily_with_capped_max_tokens_and_never_streamed(
    client, backend, extra, max_tokens
):
    r = mirror(client, {"model": "m1", "messages": U, **extra})
    assert r.status_code == 200, r.text
    assert r.headers["x-chatfleet-shadow"] == "true" and r.headers["content-type"] == "application/json"
    assert r.headers["x-chatfleet-track"] == "canary"
    body = r.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "echo: hello"
    [(messages, params)] = backend.calls
    assert messages == U
    assert {k: params[k] for k in GREEDY} == GREEDY and params["max_tokens"] == max_tokens


def test_the_chat_port_is_unchanged(client, backend):
    r = client.post("/v1/chat/completions", content=json.dumps({"messages": U, **SAMPLING}))
    assert r.status_code == 200 and "x-chatfleet-shadow" not in r.headers
    assert backend.calls[-1][1]["temperature"] == 1.5 and backend.calls[-1][1]["seed"] == 7
    assert take(client) == {"records": [], "overflowed": 0}


# ---- sessions: read, never written -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        pytest.param({"messages": U, "session_id": "conv-1"}, {}, id="body"),
        pytest.param({"messages": U}, {"X-Session-Id": "conv-1"}, id="header"),
    ],
)
def test_a_sessions_history_is_read_but_never_written(client, backend, redis, body, headers):
    key = "chatfleet:session:m1:conv-1"
    system = {"role": "system", "content": "Be brief."}
    r = mirror(client, {**body, "messages": [system, *U]}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["chatfleet"]["history"] == "ok" and r.json()["chatfleet"]["history_turns"] == 1
    seen = [system, *HISTORY, *U]
    assert backend.calls[-1][0] == seen  # the model saw what it would have seen on the chat port
    assert len(redis.lists[key]) == 1  # nothing appended
    assert take(client)["records"][0]["messages"] == seen
    assert metric(client, "chatfleet_active_sessions", model="m1") == 0
    assert metric(client, "chatfleet_dialogue_revision_switches_total", model="m1") == 0
    # the same request on the chat port does write: the store works, the shadow port chose not to
    assert client.post("/v1/chat/completions", content=json.dumps(body), headers=headers).status_code == 200
    assert len(redis.lists[key]) == 2


# ---- the records -------------------------------------------------------------------------------------


def test_records_are_taken_once(client):
    for text in ("one", "two"):
        assert mirror(client, {"messages": [{"role": "user", "content": text}]}).status_code == 200
    taken = take(client)
    assert taken["overflowed"] == 0 and [r["id"] for r in taken["records"]] == [1, 2]
    first = taken["records"][0]
    assert set(first) == {"id", "messages", "max_tokens", "answer", "error", "seconds"}
    assert first["messages"] == [{"role": "user", "content": "one"}]
    assert (first["max_tokens"], first["answer"], first["error"]) == (8, "echo: one", None)
    assert isinstance(first["seconds"], float) and 0 <= first["seconds"] < 5
    assert take(client) == {"records": [], "overflowed": 0}  # taken means gone
    mirror(client, {"messages": U})
    assert [r["id"] for r in take(client)["records"]] == [3]  # ids keep increasing


def test_the_ring_keeps_the_newest_and_counts_what_it_dropped():
    s = Shadow(max_tokens=8, concurrency=2)
    for i in range(RECORDS_LIMIT + 3):
        s.record([{"role": "user", "content": f"q{i}"}], 8, f"a{i}", None, 0.1)
    taken = s.take()
    ids = [r["id"] for r in taken["records"]]
    assert (len(ids), ids[0], ids[-1], taken["overflowed"]) == (200, 4, 203, 3)
    assert s.take() == {"records": [], "overflowed": 0} and len(s) == 0


def test_shadow_and_pipeline_doctests():
    for module in (shadow, pipeline):
        failed, tried = doctest.testmod(module)
        assert tried and not failed, module.__name__


@pytest.mark.parametrize(
    ("mode", "status", "error"),
    [
        pytest.param("down", 200, "fallback (unavailable)", id="fallback"),
        pytest.param("hang", 200, "fallback (timeout)", id="deadline-fallback"),
        pytest.param(
            "invalid", 400, "HTTP 400: messages: the prompt is 9999 tokens, more than the 100 left", id="400"
        ),
        pytest.param("boom", 500, "RuntimeError: boom", id="exception"),
    ],
)
def test_no_answer_from_the_model_is_recorded_as_an_error(client, backend, mode, status, error):
    backend.mode = mode
    r = mirror(client, {"messages": U})
    assert r.status_code == status and r.headers["x-chatfleet-shadow"] == "true"
    [record] = take(client)["records"]
    assert (record["answer"], record["error"], record["messages"]) == (None, error, U)
    assert metric(client, "chatfleet_shadow_requests_total", outcome="error") == 1
    assert metric(client, "chatfleet_shadow_requests_total", outcome="answered") == 0


def test_a_fallback_answer_is_sent_marked_but_recorded_as_an_error(client, backend):
    backend.mode = "down"
    r = mirror(client, {"messages": U})
    assert r.headers["x-chatfleet-fallback"] == "text" and r.json()["chatfleet"]["fallback"] is True
    assert take(client)["records"][0]["answer"] is None
    assert metric(client, "chatfleet_requests_total", outcome="fallback", stream="false") == 1


def test_mirrors_count_in_the_normal_request_metrics(client):
    mirror(client, {"messages": U, "stream": True})
    assert metric(client, "chatfleet_requests_total", outcome="success", code="200", stream="false") == 1
    assert metric(client, "chatfleet_request_duration_seconds_count", stream="false") == 1
    assert metric(client, "chatfleet_shadow_requests_total", outcome="answered") == 1
    assert metric(client, "chatfleet_shadow_requests_total", outcome="dropped") == 0


def test_a_body_the_chat_api_refuses_is_refused_and_not_recorded(client, backend):
    r = mirror(client, {"messages": [], "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert r.headers["x-chatfleet-shadow"] == "true" and backend.calls == []
    assert take(client)["records"] == []
    assert metric(client, "chatfleet_requests_total", outcome="client_error", stream="false") == 1
    assert metric(client, "chatfleet_shadow_requests_total", outcome="error") == 1


# ---- the bound ---------------------------------------------------------------------------------------


class GatedBackend(Backend):
    """Completions of "wait" hold until the gate opens; others answer at once."""

    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def complete(self, messages, params, timeout):
        if messages[-1]["content"] == "wait":
            self.waiting += 1
            await self.gate.wait()
        return await super().complete(messages, params, timeout)


def test_one_more_than_the_bound_is_refused_at_once_and_counted_dropped():
    backend = GatedBackend()
    app = create_app(settings(request_timeout_s=10), backend=backend)
    wait = {"messages": [{"role": "user", "content": "wait"}]}

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://pod:{SHADOW_PORT}") as c:
            held = [asyncio.create_task(c.post("/v1/chat/completions", json=wait)) for _ in range(2)]
            while backend.waiting < 2:
                await asyncio.sleep(0.01)
            over = await c.post("/v1/chat/completions", json=wait)
            chat = await c.post("http://pod:8080/v1/chat/completions", json={"messages": U})
            text = (await c.get("http://pod:8090/metrics")).text
            backend.gate.set()
            done = [await t for t in held]
            after = await c.post("/v1/chat/completions", json={"messages": U})
            records = (await c.post("http://pod:8082/shadow/records")).json()
        return over, chat, text, done, after, records

    over, chat, text, done, after, records = asyncio.run(scenario())
    assert over.status_code == 429 and over.headers["x-chatfleet-shadow"] == "true"
    assert over.json()["error"]["code"] == "shadow_dropped"
    assert chat.status_code == 200  # the chat port is not bound by the shadow's limit
    assert 'chatfleet_shadow_requests_total{model="m1",outcome="dropped"} 1.0' in text
    assert backend.waiting == 2  # the dropped one never reached the model
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200  # the slots came back
    assert len(records["records"]) == 3  # the dropped one left no record
    assert 'outcome="client_error",code="429"' not in text  # nothing was served: not a request


# ---- ports -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("GET", "/v1/chat/completions", id="chat-get"),
        pytest.param("GET", "/shadow/records", id="records-get"),
        pytest.param("GET", "/healthz", id="healthz"),
        pytest.param("GET", "/readyz", id="readyz"),
        pytest.param("GET", "/metrics", id="metrics"),
        pytest.param("GET", "/v1/models", id="models"),
        pytest.param("POST", "/drain", id="drain"),
        pytest.param("GET", "/docs", id="docs"),
        pytest.param("GET", "/openapi.json", id="openapi"),
        pytest.param("POST", "/v1/completions", id="other"),
    ],
)
def test_anything_else_on_the_shadow_port_is_404(client, method, path):
    assert client.request(method, f"{SHADOW}{path}").status_code == 404


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_records_are_not_on_the_chat_or_the_shadow_port(client, method):
    mirror(client, {"messages": U})
    assert client.request(method, "/shadow/records").status_code == 404
    assert client.request(method, f"{SHADOW}/shadow/records").status_code == 404
    assert len(take(client)["records"]) == 1


def test_without_a_shadow_port_there_is_none(backend):
    with TestClient(create_app(settings(shadow_port=0), backend=backend)) as c:
        r = c.post(f"{SHADOW}/v1/chat/completions", content=json.dumps({"messages": U, **SAMPLING}))
        assert "x-chatfleet-shadow" not in r.headers and backend.calls[-1][1]["temperature"] == 1.5


# ---- draining ----------------------------------------------------------------------------------------


def test_a_draining_pod_refuses_mirrors_and_they_never_hold_the_drain(client, backend, clock):
    mirror(client, {"messages": U})
    client.post(f"{ADMIN}/drain")
    r = mirror(client, {"messages": U})
    assert r.status_code == 503 and r.json()["error"]["code"] == "replica_draining"
    # the connection stays open until the drain has settled (the gateway may still send here)
    assert r.headers["retry-after"] == "1" and "connection" not in r.headers
    assert r.headers["x-chatfleet-shadow"] == "true" and len(backend.calls) == 1
    assert client.post("/v1/chat/completions", content=json.dumps({"messages": U})).status_code == 200
    assert metric(client, "chatfleet_shadow_requests_total", outcome="dropped") == 1
    assert metric(client, "chatfleet_drain_refused_total", model="m1") == 0
    assert len(take(client)["records"]) == 1  # what was recorded can still be taken
    clock.now += 5
    mirror(client, {"messages": U})  # a mirror arriving now does not restart the quiet period
    assert client.get(f"{ADMIN}/drain").json()["drained"] is True


# ---- the command line and the real server on two sockets ----------------------------------------------


def test_the_shadow_flags_reach_the_settings(monkeypatch):
    served = []
    monkeypatch.setattr(api, "serve", lambda app, host, port, log_level: served.append((app, port)))
    argv = ["--port=8080", "--shadow-port=8081", "--shadow-max-tokens=16", "--shadow-concurrency=3"]
    assert api.main(argv) == 0
    assert api.main([]) == 0
    got = [(p, a.state.settings.shadow_port, a.state.pipeline.shadow.max_tokens) for a, p in served]
    assert got == [(8080, 8081, 16), (8080, 0, 64)]
    assert [a.state.pipeline.shadow.concurrency for a, _ in served] == [3, 2]


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--port=8080", "--shadow-port=8080"], id="same-port"),
        pytest.param(["--shadow-port=8081", "--shadow-concurrency=0"], id="no-concurrency"),
    ],
)
def test_bad_shadow_flags_are_refused(monkeypatch, argv):
    monkeypatch.setattr(api, "serve", lambda *a: pytest.fail("served"))
    with pytest.raises(SystemExit) as exc:
        api.main(argv)
    assert exc.value.code == 2


SERVER = """
import sys
from chatfleet_runtime.chat.api import ApiSettings, create_app, serve
from chatfleet_runtime.chat.backend import Chunk

class Echo:
    async def ready(self):
        return True
    async def close(self):
        pass
    async def complete(self, messages, params, timeout):
        return Chunk(f"echo {params['max_tokens']} {params['temperature']}", "stop", 1, prompt_tokens=1)

port, shadow_port, admin, metrics = (int(a) for a in sys.argv[1:5])
settings = ApiSettings(
    model_name="m", drain_settle_s=0.2, max_new_tokens=50, shadow_port=shadow_port, admin_port=admin, metrics_port=metrics
)
serve(create_app(settings, backend=Echo()), "127.0.0.1", port)
"""


def test_the_real_server_serves_both_ports_and_stops_on_sigterm(tmp_path):
    script = tmp_path / "two_ports.py"
    script.write_text(SERVER)
    port, shadow_port, admin, metrics = free_port(), free_port(), free_port(), free_port()
    chat, mirrored = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{shadow_port}"
    admin_url = f"http://127.0.0.1:{admin}"
    argv = [sys.executable, str(script), str(port), str(shadow_port), str(admin), str(metrics)]
    with open(tmp_path / "api.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(timeout=30) as c:
            wait_until(lambda: c.get(f"{admin_url}/readyz").status_code == 200, 60, "the admin port")
            body = {"messages": U, "temperature": 1, "max_tokens": 20}
            answer = c.post(f"{chat}/v1/chat/completions", json=body)
            assert answer.json()["choices"][0]["message"]["content"] == "echo 20 1.0"
            shadowed = c.post(f"{mirrored}/v1/chat/completions", json=body)
            assert shadowed.headers["x-chatfleet-shadow"] == "true"
            assert shadowed.json()["choices"][0]["message"]["content"] == "echo 20 0.0"
            assert c.get(f"{mirrored}/healthz").status_code == 404
            assert c.post(f"{chat}/shadow/records").status_code == 404
            assert c.post(f"{mirrored}/shadow/records").status_code == 404
            records = c.post(f"{admin_url}/shadow/records").json()
            assert [(r["id"], r["answer"]) for r in records["records"]] == [(1, "echo 20 0.0")]
        proc.send_signal(signal.SIGTERM)  # no preStop hook: drains (0.2 s settle), then both close
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
