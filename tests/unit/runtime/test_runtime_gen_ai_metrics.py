"""The chat API's OpenTelemetry GenAI server metrics, as Prometheus scrapes them (docs/metrics.md).

Test design: the real app with the fake Triton backend of the chat API tests; each request's outcome is
read back from the metrics port under the names and labels the OpenTelemetry-to-Prometheus translation
of gen_ai.server.request.duration, .time_to_first_token and .time_per_output_token gives.
"""

from __future__ import annotations

import json

import pytest
from chatfleet_runtime.chat.api import ApiSettings, create_app
from fastapi.testclient import TestClient
from test_runtime_chat_api import METRICS, FakeBackend, U, metric, post

DURATION = "gen_ai_server_request_duration_seconds"
TTFT = "gen_ai_server_time_to_first_token_seconds"
TPOT = "gen_ai_server_time_per_output_token_seconds"
CHAT = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "m1", "gen_ai_response_model": "m1"}


@pytest.fixture
def backend():
    return FakeBackend()


@pytest.fixture
def client(backend):
    with TestClient(create_app(ApiSettings(model_name="m1", request_timeout_s=0.5), backend=backend)) as c:
        yield c


def stream(client) -> None:
    with client.stream(
        "POST", "/v1/chat/completions", content=json.dumps({"messages": U, "stream": True})
    ) as r:
        assert r.status_code == 200
        r.read()


def test_a_streamed_answer_records_duration_first_token_and_time_per_token(client):
    stream(client)
    assert metric(client, f"{DURATION}_count", error_type="", **CHAT) == 1
    assert metric(client, f"{TTFT}_count", **CHAT) == 1
    assert metric(client, f"{TPOT}_count", **CHAT) == 1  # 3 tokens: the 2 after the first
    assert metric(client, f"{TPOT}_sum", **CHAT) <= metric(client, f"{DURATION}_sum", **CHAT)


def test_a_non_streamed_answer_has_no_time_per_token(client):
    assert post(client, {"messages": U}).status_code == 200
    assert metric(client, f"{DURATION}_count", error_type="", **CHAT) == 1
    assert metric(client, f"{TTFT}_count", **CHAT) == 1  # the whole response, as it is not streamed
    assert metric(client, f"{TPOT}_count", **CHAT) == 0


def test_failures_name_their_error_type_and_count_no_token_times(client, backend):
    for mode, code in (("invalid", 400), ("overloaded", 429), ("down", 200)):
        backend.mode = mode
        assert post(client, {"messages": U}).status_code == code
    errors = {e: metric(client, f"{DURATION}_count", error_type=e, **CHAT) for e in ("invalid", "overloaded")}
    assert errors == {"invalid": 1, "overloaded": 1}
    assert metric(client, f"{DURATION}_count", error_type="fallback_unavailable", **CHAT) == 1
    assert metric(client, f"{TTFT}_count", **CHAT) == 0 and metric(client, f"{TPOT}_count", **CHAT) == 0


def test_the_model_labels_are_the_served_models_never_the_users_text(client):
    assert post(client, {"model": "m1", "messages": U}).status_code == 200
    assert post(client, {"model": "anything-a-user-types", "messages": U}).status_code == 404
    assert "anything-a-user-types" not in client.get(f"{METRICS}/metrics").text
    assert metric(client, f"{DURATION}_count", **CHAT) == 1
