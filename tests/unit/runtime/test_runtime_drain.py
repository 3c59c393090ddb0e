"""Draining a replica: the drain's state (a table over an injected clock), the chat API while draining
(readiness, Connection: close once settled, refusals past the deadline, streams finished), the preStop client, and
the real uvicorn process draining on a SIGTERM that came without a preStop hook.

Test design: the state is a pure class, so its rules are one table of steps at given clock times. The
API is driven with the fake backend of test_runtime_chat_api and the drain's clock injected; the
stream-while-draining case calls the ASGI app directly, since TestClient buffers a whole response and
cannot interleave a stream with other calls. One test runs the real server process with a slow fake
backend and sends it SIGTERM mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest
from chatfleet_runtime.chat import drain as drain_mod
from chatfleet_runtime.chat.api import ApiSettings, create_app
from chatfleet_runtime.chat.backend import Chunk
from chatfleet_runtime.chat.drain import Drain
from chatfleet_runtime.launcher.tritonhome import free_port
from fastapi.testclient import TestClient
from test_runtime_chat_api import FakeBackend, U, metric, post

#: ApiSettings' admin and scrape ports; a relative URL goes to the chat port. LOOPBACK: the pod itself.
ADMIN_PORT = 8082
ADMIN, METRICS = f"http://testserver:{ADMIN_PORT}", "http://testserver:8090"
LOOPBACK = ("127.0.0.1", 50000)

# ---- the state: one table ----------------------------------------------------------------------------

# settle 5 s, grace 30 s, request timeout 10 s: a request is admitted while now + 10 <= began + 28.
# Steps: (time, action) with action one of begin, enter, leave, or an expectation:
# "admit"/"refuse" (admit() says so), "drained"/"not drained", "settled"/"not settled".
TABLE = {
    "serving-normally": [(0, "admit"), (0, "not drained"), (100, "not drained"), (100, "not settled")],
    "settle-since-the-begin": [
        (10, "begin"),
        (14.9, "not settled"),
        (14.9, "not drained"),
        (15, "settled"),
        (15, "drained"),
    ],
    "settled-while-requests-still-arrive": [(0, "begin"), (4, "enter"), (5, "settled"), (5, "not drained")],
    "quiet-period-after-the-last-arrival": [
        (0, "begin"),
        (4, "enter"),
        (4.5, "leave"),
        (5, "not drained"),  # 5 s since the begin, but a request came 1 s ago
        (8.9, "not drained"),
        (9, "drained"),
    ],
    "in-flight-holds-it": [(0, "begin"), (1, "enter"), (60, "not drained"), (60, "leave"), (60, "drained")],
    "deadline-refusal": [
        (0, "begin"),
        (18, "admit"),  # 18 + 10 = 28 = 30 - 2: it can still finish
        (18.01, "refuse"),
        (25, "refuse"),
    ],
    "begin-is-idempotent": [(0, "begin"), (4, "begin"), (5, "drained"), (18, "admit"), (19, "refuse")],
    "refused-arrivals-still-reset-the-quiet": [
        (0, "begin"),
        (20, "enter"),
        (20, "refuse"),
        (20, "leave"),
        (24, "not drained"),
        (25, "drained"),
    ],
}


@pytest.mark.parametrize("steps", list(TABLE.values()), ids=list(TABLE))
def test_drain_state_table(steps):
    now = [0.0]
    d = Drain(settle_s=5, grace_s=30, request_timeout_s=10, clock=lambda: now[0])
    refusals = 0
    for at, action in steps:
        now[0] = at
        if action in ("begin", "enter", "leave"):
            getattr(d, action)()
        elif action in ("admit", "refuse"):
            assert d.admit() is (action == "admit"), (at, action)
            refusals += action == "refuse"
        elif action.endswith("settled"):
            assert d.settled() is (action == "settled"), (at, action)
        else:
            assert d.drained() is (action == "drained"), (at, action)
    assert d.refused == refusals


def test_drain_state_json():
    now = [0.0]
    d = Drain(settle_s=5, grace_s=30, request_timeout_s=10, clock=lambda: now[0])
    assert d.state() == {
        "draining": False,
        "inflight": 0,
        "drained": False,
        "since_seconds": 0.0,
        "refused": 0,
    }
    assert (d.begin(), d.begin()) == (True, False)
    d.enter()
    now[0] = 2.5
    assert d.state() == {
        "draining": True,
        "inflight": 1,
        "drained": False,
        "since_seconds": 2.5,
        "refused": 0,
    }
    assert d.exit_at() == 30


def test_grace_defaults_to_what_the_operator_sets_and_env_names():
    s = ApiSettings.from_env(
        {
            "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "20",
            "CHATFLEET_DRAIN_SETTLE_SECONDS": "3",
            "CHATFLEET_SESSION_TTL_SECONDS": "600",
        }
    )
    assert (s.drain_settle_s, s.grace_s, s.idle_s) == (3.0, 33.0, 600)
    s = ApiSettings.from_env({"CHATFLEET_DRAIN_GRACE_SECONDS": "45", "CHATFLEET_DIALOGUE_IDLE_SECONDS": "90"})
    assert (s.drain_settle_s, s.grace_s, s.idle_s) == (5.0, 45.0, 90.0)


# ---- the chat API while draining ---------------------------------------------------------------------


class Clock:
    """The drain's injected clock."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def draining_settings(**kw):
    base = {
        "model_name": "m1",
        "request_timeout_s": 10,
        "drain_settle_s": 5,
        "drain_grace_s": 30,
        "max_new_tokens": 50,
    }
    return ApiSettings(**{**base, **kw})


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def dclient(backend, clock):
    # from the pod's own loopback, as the preStop hook calls the drain
    with TestClient(create_app(draining_settings(), backend=backend, clock=clock), client=LOOPBACK) as c:
        yield c


@pytest.fixture
def backend():
    return FakeBackend()


def test_readyz_fails_while_draining(dclient):
    for _ in range(50):  # the lifespan's wait_ready task (the fake backend is ready at once)
        if dclient.get(f"{ADMIN}/readyz").status_code == 200:
            break
    assert dclient.get(f"{ADMIN}/readyz").status_code == 200
    assert dclient.post(f"{ADMIN}/drain").json()["draining"] is True
    r = dclient.get(f"{ADMIN}/readyz")
    assert (r.status_code, r.json()) == (503, {"status": "draining"})


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("POST", "/v1/chat/completions", {"messages": U}, id="completion"),
        pytest.param("POST", "/v1/chat/completions", {"messages": U, "stream": True}, id="stream"),
        pytest.param("POST", "/v1/chat/completions", {"messages": []}, id="error-400"),
        pytest.param("GET", "/v1/models", None, id="models"),
        pytest.param("GET", f"{ADMIN}/healthz", None, id="healthz"),
        pytest.param("GET", f"{ADMIN}/readyz", None, id="readyz"),
        pytest.param("GET", f"{METRICS}/metrics", None, id="metrics"),
        pytest.param("GET", f"{ADMIN}/drain", None, id="drain"),
    ],
)
def test_every_response_says_connection_close_once_the_drain_settled(dclient, clock, method, path, body):
    """Not before: while the gateway still routes here, a close would race the gateway's next request on
    that connection (Traefik's fast proxy answers it 502; tests/integration/platform/test_gateway_drain.py)."""
    content = json.dumps(body) if body is not None else None
    assert "connection" not in dclient.request(method, path, content=content).headers
    dclient.post(f"{ADMIN}/drain")
    clock.now += 4.9  # settle 5 s
    assert "connection" not in dclient.request(method, path, content=content).headers
    clock.now += 0.1
    assert dclient.request(method, path, content=content).headers["connection"] == "close"


def test_requests_are_served_until_the_deadline_then_refused(dclient, backend, clock):
    started = dclient.post(f"{ADMIN}/drain").json()
    assert started == {"draining": True, "inflight": 0, "drained": False, "since_seconds": 0.0, "refused": 0}
    assert dclient.post(f"{ADMIN}/drain").json()["since_seconds"] == 0.0  # idempotent
    clock.now += 18  # 18 + 10 (timeout) = 30 (grace) - 2: still finishes in time
    r = post(dclient, {"messages": U})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: hello"
    calls = len(backend.calls)
    clock.now += 0.5
    for stream in (False, True):
        r = post(dclient, {"messages": U, "stream": stream})
        assert r.status_code == 503, r.text
        assert (r.headers["retry-after"], r.headers["connection"]) == ("1", "close")
        error = r.json()["error"]
        assert "draining" in error["message"] and error["code"] == "replica_draining"
        assert error["type"] == "server_error"
    assert len(backend.calls) == calls
    assert metric(dclient, "chatfleet_drain_refused_total", model="m1") == 2
    assert dclient.get(f"{ADMIN}/drain").json()["refused"] == 2


def test_once_settled_the_stream_relays_direct_requests_are_refused_so_it_moves_the_dialogue(dclient, clock):
    """The relay sends a dialogue's turns to its replica's address, past the endpoints: a draining pod
    would keep getting them (and stay not drained) until its admission closes. Once the endpoint removal
    has reached the proxies (settled), a request from the relay is refused (the relay takes the 503 to
    the next replica); one through the proxies is still served."""
    relay = {"X-Chatfleet-Relay": "1"}
    dclient.post(f"{ADMIN}/drain")
    clock.now += 4.9
    assert post(dclient, {"messages": U}, headers=relay).status_code == 200  # not settled yet
    clock.now += 0.1
    refused = post(dclient, {"messages": U, "stream": True}, headers=relay)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "replica_draining"
    assert post(dclient, {"messages": U}).status_code == 200  # admission is still open for the others
    assert dclient.get(f"{ADMIN}/drain").json()["refused"] == 1  # counted where the metric counts it


def test_drained_after_the_settle_period(dclient, clock):
    dclient.post(f"{ADMIN}/drain")
    clock.now += 4
    post(dclient, {"messages": U})  # one more request came in through a stale route
    clock.now += 4.9
    assert dclient.get(f"{ADMIN}/drain").json()["drained"] is False
    clock.now += 0.1
    assert dclient.get(f"{ADMIN}/drain").json() == {
        "draining": True,
        "inflight": 0,
        "drained": True,
        "since_seconds": 9.0,
        "refused": 0,
    }


def test_draining_gauge(dclient):
    assert metric(dclient, "chatfleet_draining", model="m1") == 0
    assert metric(dclient, "chatfleet_drain_refused_total", model="m1") == 0
    dclient.post(f"{ADMIN}/drain")
    assert metric(dclient, "chatfleet_draining", model="m1") == 1


class GatedBackend(FakeBackend):
    """Streams 'one ', then waits for the gate, then 'two three'."""

    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()

    async def stream(self, messages, params, timeout):
        yield Chunk("one ")
        await self.gate.wait()
        yield Chunk("two three")
        yield Chunk("", "stop", 3, prompt_tokens=7)


class AsgiCall:
    """One HTTP request driven straight into the ASGI app, its response recorded as it comes."""

    def __init__(self, app, method: str, path: str, body: bytes = b"", port: int = 8080):
        self.app, self.method, self.path, self.body, self.port = app, method, path, body, port
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.got_body = asyncio.Event()
        self.body_sent = False
        self.task: asyncio.Task | None = None

    async def receive(self):
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves

    async def send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message.get("body"):
            self.chunks.append(message["body"])
            self.got_body.set()

    def start(self) -> AsgiCall:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": self.method,
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", self.port),
        }
        self.task = asyncio.create_task(self.app(scope, self.receive, self.send))
        return self

    async def done(self) -> AsgiCall:
        await asyncio.wait_for(self.task, 10)
        return self

    def json(self):
        return json.loads(b"".join(self.chunks))

    def text(self) -> str:
        return b"".join(self.chunks).decode()


def test_a_stream_started_before_the_drain_completes_and_the_drain_waits_for_it():
    backend, clock = GatedBackend(), Clock()
    app = create_app(draining_settings(), backend=backend, clock=clock)

    async def scenario():
        body = json.dumps({"messages": U, "stream": True}).encode()
        stream = AsgiCall(app, "POST", "/v1/chat/completions", body).start()
        await asyncio.wait_for(stream.got_body.wait(), 10)
        began = (await AsgiCall(app, "POST", "/drain", port=ADMIN_PORT).start().done()).json()
        clock.now += 100  # far past the settle period and past the pod's own deadline
        during = (await AsgiCall(app, "GET", "/drain", port=ADMIN_PORT).start().done()).json()
        assert not stream.task.done()
        backend.gate.set()
        await stream.done()
        after = (await AsgiCall(app, "GET", "/drain", port=ADMIN_PORT).start().done()).json()
        return stream, began, during, after

    stream, began, during, after = asyncio.run(scenario())
    assert (began["draining"], began["inflight"]) == (True, 1)
    assert (during["inflight"], during["drained"]) == (1, False)
    assert stream.status == 200
    events = [json.loads(line[6:]) for line in stream.text().split("\n\n") if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "one two three"
    assert stream.text().endswith("data: [DONE]\n\n") and events[-1]["choices"][0]["finish_reason"] == "stop"
    assert (after["inflight"], after["drained"]) == (0, True)


# ---- the preStop client ------------------------------------------------------------------------------


def test_the_client_exits_0_at_once_when_the_api_is_unreachable(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert drain_mod.main([f"--url={url}", "--timeout=30"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "unreachable" in out and "nothing to drain" in out


@pytest.fixture
def fake_api():
    """A stdlib HTTP server on 127.0.0.1 answering /drain: not drained on POST, drained on GET."""
    import http.server

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, drained):
            seen.append(f"{self.command} {self.path}")
            body = json.dumps(
                {"draining": True, "inflight": 0, "drained": drained, "since_seconds": 1.0, "refused": 0}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.answer(False)

        def do_GET(self):
            self.answer(True)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_the_client_posts_then_polls_until_drained(fake_api, capsys):
    url, seen = fake_api
    assert drain_mod.main([f"--url={url}", "--timeout=30"]) == 0
    assert seen == ["POST /drain", "GET /drain"]
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "drained after" in out


class Script:
    """The client's HTTP calls, clock and sleeps, scripted: answers (dict, or an exception) in order."""

    def __init__(self, answers):
        self.answers, self.calls, self.now = list(answers), [], 0.0

    def request(self, method, url):
        self.calls.append(method)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def sleep(self, s):
        self.now += s


NOT = {"drained": False, "inflight": 1, "refused": 0}
DONE = {"drained": True, "since_seconds": 6.0, "refused": 0}


@pytest.mark.parametrize(
    ("answers", "calls", "says"),
    [
        pytest.param([ConnectionRefusedError("refused")], ["POST"], "nothing to drain", id="unreachable"),
        pytest.param([DONE], ["POST"], "drained after", id="already-drained"),
        pytest.param([NOT, NOT, DONE], ["POST", "GET", "GET"], "drained after 1.0 s", id="polls"),
        pytest.param([NOT] * 10, ["POST", "GET", "GET", "GET"], "not drained after 1.5 s", id="times-out"),
        pytest.param([NOT, OSError("reset")], ["POST", "GET"], "went away", id="api-gone"),
        pytest.param([NOT, ValueError("not JSON")], ["POST", "GET"], "went away", id="garbage"),
    ],
)
def test_the_client_script(answers, calls, says):
    s = Script(answers)
    line = drain_mod.run("http://x", 1.5, request=s.request, clock=lambda: s.now, sleep=s.sleep)
    assert s.calls == calls and says in line, line


@pytest.mark.parametrize(
    ("env", "timeout"),
    [
        pytest.param({}, 120.0, id="unset"),
        pytest.param({"CHATFLEET_DRAIN_GRACE_SECONDS": "45"}, 43.0, id="grace-minus-2"),
        pytest.param({"CHATFLEET_DRAIN_GRACE_SECONDS": "1"}, 0.0, id="never-negative"),
        pytest.param({"CHATFLEET_DRAIN_GRACE_SECONDS": "soon"}, 120.0, id="garbage"),
    ],
)
def test_the_client_timeout_comes_from_the_grace(env, timeout):
    assert drain_mod.default_timeout(env) == timeout


def test_the_client_needs_only_the_standard_library():
    """It runs as `python3 -m chatfleet_runtime.chat.drain` in the image and must start fast."""
    code = textwrap.dedent(
        f"""
        import sys, runpy
        sys.argv = ["drain", "--url=http://127.0.0.1:{free_port()}"]
        try:
            runpy.run_module("chatfleet_runtime.chat.drain", run_name="__main__")
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        heavy = sorted({{"fastapi", "uvicorn", "httpx", "prometheus_client", "redis"}} & set(sys.modules))
        assert not heavy, heavy
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "nothing to drain" in done.stdout


# ---- the real server: SIGTERM without a preStop hook drains, the stream finishes ------------------------

SERVER = """
import asyncio, logging, sys
from chatfleet_runtime.chat.api import ApiSettings, create_app, serve
from chatfleet_runtime.chat.backend import Chunk

class Slow:
    async def ready(self):
        return True
    async def close(self):
        pass
    async def complete(self, messages, params, timeout):
        return Chunk("quick", "stop", 1, prompt_tokens=1)
    async def stream(self, messages, params, timeout):
        for i in range(20):
            await asyncio.sleep(0.1)
            yield Chunk(f"w{i} ")
        yield Chunk("", "stop", 20, prompt_tokens=1)

logging.basicConfig(level=logging.INFO)
port, admin, metrics = (int(a) for a in sys.argv[1:4])
settings = ApiSettings(
    model_name="m", request_timeout_s=20, drain_settle_s=0.5, max_new_tokens=50, admin_port=admin, metrics_port=metrics
)
serve(create_app(settings, backend=Slow()), "127.0.0.1", port)
"""


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            value = predicate()
            if value:
                return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def real_server(tmp_path):
    """The SERVER script as a process on free ports, ready; (process, chat port, admin port). Killed at
    the end."""
    script = tmp_path / "slow_api.py"
    script.write_text(SERVER)
    port, admin, metrics = free_port(), free_port(), free_port()
    log = open(tmp_path / "api.log", "wb")  # noqa: SIM115 - closed below
    argv = [sys.executable, str(script), str(port), str(admin), str(metrics)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(timeout=30) as probe:
            wait_until(
                lambda: probe.get(f"http://127.0.0.1:{admin}/readyz").status_code == 200,
                60,
                "the API to be ready",
            )
        yield proc, port, admin
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def test_sigterm_without_a_prestop_hook_drains_and_lets_the_stream_finish(tmp_path):
    with real_server(tmp_path) as (proc, port, admin):
        url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
        with httpx.Client(timeout=30) as client:
            body = {"messages": U, "stream": True}
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                lines = resp.iter_lines()
                assert next(line for line in lines if '"content": "w0 "' in line)
                proc.send_signal(signal.SIGTERM)
                with httpx.Client(timeout=30) as other:  # a new connection: still served while draining
                    wait_until(lambda: other.get(f"{admin_url}/drain").json()["draining"], 30, "the drain")
                    assert other.get(f"{admin_url}/readyz").status_code == 503
                    # settled (0.5 s) while the stream still runs: answers now close their connection
                    wait_until(
                        lambda: other.get(f"{admin_url}/drain").json()["since_seconds"] >= 0.5, 30, "settle"
                    )
                    late = other.post(f"{url}/v1/chat/completions", json={"messages": U})
                    assert late.status_code == 200 and late.headers["connection"] == "close"
                rest = list(lines)
        assert [x for x in rest if x][-1] == "data: [DONE]"
        text = "".join(json.loads(x[6:])["choices"][0]["delta"].get("content", "") for x in rest if "{" in x)
        assert text.endswith("w19 ")
        assert proc.wait(timeout=60) == 0


def test_an_idle_keep_alive_connection_outlives_a_proxys_pause(tmp_path):
    """A proxy (Traefik) keeps idle upstream connections 90 s and sends the next request on one: the
    server must not close it first. With uvicorn's default (5 s) the second request below, 6 s after the
    first on the same connection, finds it closed."""
    with real_server(tmp_path) as (_, port, _admin):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"messages": U})
        for pause in (6, 0):
            conn.request(
                "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("connection") != "close"
            resp.read()
            time.sleep(pause)
        conn.close()
