"""The chat API's ports: each owner reaches only its own routes (docs/security.md "Ports").

Test design: one app, one TestClient per caller -- an end user on the chat port (any client address), the
kubelet and the operator on the admin port (a pod-network address), the pod itself (loopback), Prometheus
on the metrics port -- and every route a replica has, under spellings a user might try. A user's request,
whatever its path, method or spelling, never changes the replica's state: it stays Ready, not draining.
"""

from __future__ import annotations

import json

import pytest
from chatfleet_runtime.chat import api
from chatfleet_runtime.chat.api import ApiSettings, create_app, listening_ports
from fastapi.testclient import TestClient
from test_runtime_chat_api import FakeBackend, U

CHAT, ADMIN, METRICS, SHADOW = 8080, 8082, 8090, 8081
USER = ("203.0.113.7", 40000)  # an end user (through the gateway or the Service)
NETWORK = ("10.245.0.1", 40000)  # the kubelet or the operator, from the pod network
LOOPBACK = ("127.0.0.1", 40000)  # the pod itself: its preStop hook


def url(port: int, path: str) -> str:
    """A URL on one of the replica's ports."""
    return f"http://pod:{port}{path}"


@pytest.fixture
def app():
    return create_app(ApiSettings(model_name="m1", shadow_port=SHADOW), backend=FakeBackend())


def caller(app, address):
    return TestClient(app, client=address)


#: What a user might send to take a replica out of service or read its state.
ADMIN_PATHS = [
    ("POST", "/drain"),
    ("GET", "/drain"),
    ("POST", "/drain/"),
    ("POST", "//drain"),
    ("POST", "/Drain"),
    ("POST", "/DRAIN"),
    ("POST", "/%64rain"),
    ("POST", "/v1/../drain"),
    ("POST", "/drain?x=1"),
    ("PUT", "/drain"),
    ("POST", "/shadow/records"),
    ("GET", "/shadow/records"),
    ("GET", "/metrics"),
    ("GET", "/readyz"),
    ("GET", "/healthz"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/v2/health/ready"),
    ("POST", "/v2/models/chat/infer"),
]


@pytest.mark.parametrize(("method", "path"), [pytest.param(m, p, id=f"{m} {p}") for m, p in ADMIN_PATHS])
def test_a_user_on_the_chat_port_reaches_no_admin_route_and_the_replica_stays_ready(app, method, path):
    with caller(app, USER) as user, caller(app, NETWORK) as kubelet:
        r = user.request(method, url(CHAT, path))
        assert r.status_code == 404, (r.status_code, r.text)
        ready = kubelet.get(url(ADMIN, "/readyz"))
        assert (ready.status_code, ready.json()["status"]) == (200, "ready")
        assert app.state.drain.draining is False


def test_the_chat_port_serves_the_chat(app):
    with caller(app, USER) as user:
        assert user.get(url(CHAT, "/v1/models")).json()["data"][0]["id"] == "m1"
        r = user.post(url(CHAT, "/v1/chat/completions"), content=json.dumps({"messages": U}))
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: hello"


def test_the_chat_port_says_whether_the_replica_takes_chats_and_nothing_more(app):
    """GET /health, as stock OpenAI-compatible clients ask first (guidellm): 200 while it serves, 503 once it
    drains; the body says only that (the drain's counts and the breaker stay on the admin port)."""
    with caller(app, USER) as user, caller(app, LOOPBACK) as pod:
        r = user.get(url(CHAT, "/health"))
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
        assert user.post(url(CHAT, "/health")).status_code == 405  # reads only
        assert pod.post(url(ADMIN, "/drain")).status_code == 200
        r = user.get(url(CHAT, "/health"))
        assert (r.status_code, r.json()) == (503, {"status": "unavailable"})
    for port in (ADMIN, METRICS, SHADOW):  # the chat port's alone
        with caller(app, NETWORK) as other:
            assert other.get(url(port, "/health")).status_code == 404


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_the_drain_refuses_anyone_but_the_pod_itself(app, method):
    with caller(app, NETWORK) as other:
        r = other.request(method, url(ADMIN, "/drain"))
        assert r.status_code == 403 and "loopback" in r.json()["detail"]
        assert app.state.drain.draining is False
    with caller(app, LOOPBACK) as hook:
        assert hook.post(url(ADMIN, "/drain")).json()["draining"] is True
        assert hook.get(url(ADMIN, "/drain")).json()["draining"] is True


def test_the_admin_port_serves_probes_and_records_and_nothing_of_the_chat(app):
    with caller(app, NETWORK) as operator:
        assert operator.get(url(ADMIN, "/healthz")).status_code == 200
        assert operator.post(url(ADMIN, "/shadow/records")).json() == {"records": [], "overflowed": 0}
        chat = operator.post(url(ADMIN, "/v1/chat/completions"), content=json.dumps({"messages": U}))
        assert chat.status_code == 404
        assert operator.get(url(ADMIN, "/metrics")).status_code == 404


def test_the_metrics_port_serves_only_the_metrics(app):
    with caller(app, NETWORK) as prometheus:
        assert "chatfleet_breaker_state" in prometheus.get(url(METRICS, "/metrics")).text
        for method, path in [("POST", "/drain"), ("GET", "/readyz"), ("POST", "/v1/chat/completions")]:
            assert prometheus.request(method, url(METRICS, path)).status_code == 404
        assert app.state.drain.draining is False


def test_the_shadow_port_serves_only_mirrored_chats(app):
    with caller(app, NETWORK) as gateway:
        r = gateway.post(url(SHADOW, "/v1/chat/completions"), content=json.dumps({"messages": U}))
        assert r.status_code == 200 and r.headers["x-chatfleet-shadow"] == "true"
        assert gateway.post(url(SHADOW, "/shadow/records")).status_code == 404
        assert gateway.post(url(SHADOW, "/drain")).status_code == 404


@pytest.mark.parametrize(
    ("kw", "port", "message"),
    [
        pytest.param({"admin_port": 8080}, 8080, "the admin port must differ from the chat port", id="admin"),
        pytest.param(
            {"metrics_port": 8082}, 8080, "the metrics port must differ from the admin", id="metrics"
        ),
        pytest.param(
            {"shadow_port": 8090}, 8080, "the shadow port must differ from the metrics", id="shadow"
        ),
        pytest.param({"admin_port": 0}, 8080, "the admin and metrics ports must be set", id="no-admin"),
    ],
)
def test_every_port_is_its_own(kw, port, message):
    with pytest.raises(ValueError, match=message):
        listening_ports(ApiSettings(**kw), port)


def test_the_ports_listened_on():
    """Chat first, then admin, metrics, and the shadow port when set."""
    assert listening_ports(ApiSettings(), 8080) == [8080, 8082, 8090]
    assert listening_ports(ApiSettings(shadow_port=8081), 8080) == [8080, 8082, 8090, 8081]


def test_the_command_line_sets_the_ports(monkeypatch):
    served = []
    monkeypatch.setattr(api, "serve", lambda app, host, port, log_level: served.append(app.state.settings))
    assert api.main(["--port=9000", "--admin-port=9001", "--metrics-port=9002"]) == 0
    assert (served[0].admin_port, served[0].metrics_port) == (9001, 9002)
    monkeypatch.setattr(api, "serve", lambda *a: pytest.fail("served"))
    with pytest.raises(SystemExit) as exc:
        api.main(["--port=9000", "--admin-port=9000"])
    assert exc.value.code == 2
