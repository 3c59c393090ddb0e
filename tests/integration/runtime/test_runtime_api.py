"""The chat API against the real Triton and Redis: chat, multi-turn, streaming, bad input, disconnects.

Test design: greedy decoding is deterministic, so "history was used" is checked by comparing a turn's
answer with Triton's answer for the composed messages (history + new) sent directly.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from chatfleet_platform.localruntime.testing import metric_value, post_json, run_concurrently

pytestmark = [pytest.mark.triton, pytest.mark.redis, pytest.mark.slow]


def chat(api, body, headers=None):
    return post_json(f"{api.url}/v1/chat/completions", body, headers=headers)


def user(text):
    return [{"role": "user", "content": text}]


def triton_text(triton, messages, max_tokens):
    params = {"max_tokens": max_tokens, "stream": False}  # generate wants one response from the model
    body = {"MESSAGES": json.dumps(messages), "PARAMETERS": json.dumps(params)}
    status, out = post_json(f"{triton.http_url}/v2/models/chat/generate", body)
    assert status == 200, out
    return out["TEXT"]


def test_models_and_single_chat(api, triton):
    with httpx.Client() as client:
        assert client.get(f"{api.url}/v1/models").json()["data"][0]["id"] == "tiny-chat"
    status, body = chat(api, {"model": "tiny-chat", "messages": user("Hello!"), "max_tokens": 8})
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 8 and body["chatfleet"]["fallback"] is False
    assert choice["message"]["content"] == triton_text(triton, user("Hello!"), 8)
    prompt_tokens = body["usage"]["prompt_tokens"]  # the rendered chat template's tokens, from Triton
    assert prompt_tokens > len("Hello!") // 4 and body["usage"]["total_tokens"] == prompt_tokens + 8


def test_stream_usage_has_prompt_tokens_like_non_streaming(api):
    body = {"messages": user("Count my tokens"), "max_tokens": 5}
    _, plain = chat(api, body)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{api.url}/v1/chat/completions", json={**body, "stream": True}) as resp,
    ):
        events = read_sse(resp)
    assert events[-1]["usage"] == plain["usage"] and plain["usage"]["prompt_tokens"] > 0


def test_openai_extras_through_the_real_stack(api):
    status, body = chat(api, {"messages": user("hi"), "user": "alice@example.com", "max_tokens": 3})
    assert status == 200 and body["chatfleet"]["session_id"].startswith("user-")
    status, body = chat(api, {"messages": user("hi"), "tools": [{"type": "function"}]})
    assert status == 400 and body["error"]["param"] == "tools"
    forced = {"messages": user("hi"), "max_tokens": 4, "logit_bias": {"100": 100}}
    status, body = chat(api, forced)
    assert status == 200 and body["usage"]["completion_tokens"] == 4
    status, penalised = chat(api, {**forced, "logit_bias": {"100": 5}, "frequency_penalty": 2})
    assert status == 200, penalised
    status, body = chat(api, {"messages": user("hi"), "logit_bias": {"999999": 1}})
    assert status == 400 and body["error"]["message"].startswith("logit_bias: token 999999 is outside")


def test_multi_turn_uses_history_from_redis(api, triton, redis_srv):
    import redis

    sid = f"multi-{time.time_ns()}"
    system = {"role": "system", "content": "You are a terse assistant."}
    s1, b1 = chat(api, {"messages": [system, *user("First question")], "max_tokens": 6, "session_id": sid})
    s2, b2 = chat(api, {"messages": [system, *user("Second question")], "max_tokens": 6, "user": sid})
    assert (s1, s2) == (200, 200)
    assert b2["chatfleet"]["history"] == "ok" and b2["chatfleet"]["history_turns"] == 1
    expected = triton_text(
        triton,
        [
            system,
            *user("First question"),
            {"role": "assistant", "content": b1["choices"][0]["message"]["content"]},
            *user("Second question"),
        ],
        6,
    )
    assert b2["choices"][0]["message"]["content"] == expected
    r = redis.Redis(port=redis_srv.port)
    key = f"chatfleet:session:tiny-chat:{sid}"
    assert r.llen(key) == 2 and 0 < r.ttl(key) <= 3600


def test_a_window_redis_lost_is_put_back_by_the_replica_that_answered_it(api, redis_srv):
    """Redis lost a dialogue's window (a restart with nothing kept does this to every key): the replica
    that answered it puts its own copy back, with a TTL, in the real Redis, and answers with it."""
    import redis

    sid = f"lost-{time.time_ns()}"
    for text in ("one", "two"):
        assert chat(api, {"messages": user(text), "max_tokens": 2, "session_id": sid})[0] == 200
    r = redis.Redis(port=redis_srv.port)
    key = f"chatfleet:session:tiny-chat:{sid}"
    assert r.llen(key) == 2
    restored_before = metric_value(api.metrics_url, "chatfleet_session_history_from_replica_total")
    r.delete(key)
    status, body = chat(api, {"messages": user("three"), "max_tokens": 2, "session_id": sid})
    assert status == 200, body
    assert (body["chatfleet"]["history"], body["chatfleet"]["history_turns"]) == ("restored", 2)
    assert [json.loads(t)["messages"][0]["content"] for t in r.lrange(key, 0, -1)] == ["one", "two", "three"]
    assert 0 < r.ttl(key) <= 3600
    assert (
        metric_value(api.metrics_url, "chatfleet_session_history_from_replica_total", source="restored")
        == restored_before + 1
    )


def test_history_is_a_sliding_window_of_turns(api, redis_srv):
    import redis

    sid = f"window-{time.time_ns()}"
    for i in range(7):
        assert (
            chat(api, {"messages": user(f"turn {i}"), "max_tokens": 2}, headers={"X-Session-Id": sid})[0]
            == 200
        )
    turns = [
        json.loads(t)
        for t in redis.Redis(port=redis_srv.port).lrange(f"chatfleet:session:tiny-chat:{sid}", 0, -1)
    ]
    assert [t["messages"][0]["content"] for t in turns] == [f"turn {i}" for i in range(2, 7)]


def test_second_turn_reuses_the_kv_prefix(api, triton):
    model = "chat"  # the one model: it holds the prefix cache of streamed and non-streamed turns alike
    sid = f"prefix-{time.time_ns()}"
    hits = metric_value(triton.metrics_url, "chatfleet_model_prefix_cache_hits_total", model=model)
    reused = metric_value(triton.metrics_url, "chatfleet_model_prefix_cache_reused_tokens_total", model=model)
    chat(api, {"messages": user("A long first message " * 20), "max_tokens": 8, "session_id": sid})
    chat(api, {"messages": user("and a follow-up"), "max_tokens": 8, "session_id": sid})
    assert metric_value(triton.metrics_url, "chatfleet_model_prefix_cache_hits_total", model=model) > hits
    assert (
        metric_value(triton.metrics_url, "chatfleet_model_prefix_cache_reused_tokens_total", model=model)
        - reused
        > 60
    )


def read_sse(response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


def test_streaming_sse_matches_non_streaming(api):
    body = {"messages": user("Stream please"), "max_tokens": 10, "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{api.url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = read_sse(resp)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert len(events) >= 3  # role chunk, text (coalesced to one chunk per 20 ms), final
    _, plain = chat(api, {"messages": user("Stream please"), "max_tokens": 10})
    assert text == plain["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        pytest.param(b"{not json", 400, "body: not valid JSON", id="malformed-json"),
        pytest.param(b"[1, 2]", 400, "body: must be a JSON object", id="not-an-object"),
        pytest.param(
            {"messages": [{"role": "robot", "content": "hi"}]},
            400,
            "messages[0].role: 'robot' is not one of system, user, assistant",
            id="unknown-role",
        ),
        pytest.param({"messages": []}, 400, "messages: must not be empty", id="no-messages"),
        pytest.param(
            {"messages": user("   ")}, 400, "messages[0].content: must not be empty", id="empty-message"
        ),
        pytest.param(
            {"messages": user("x" * 40_000)},
            413,
            "messages[0].content: 40000 characters is more than the limit",
            id="oversized-message",
        ),
        pytest.param(
            {"messages": user("hi"), "max_tokens": 5000},
            400,
            "max_tokens: 5000 is more than the limit 64",
            id="too-many-tokens",
        ),
        pytest.param(
            {"messages": user("hi"), "model": "gpt-9"},
            404,
            "model: 'gpt-9' is not served here",
            id="unknown-model",
        ),
        pytest.param(
            {"messages": user("hi"), "session_id": "no spaces allowed"},
            400,
            "session_id: must be 1-128 characters",
            id="bad-session-id",
        ),
        pytest.param(
            {"messages": user("hi"), "temperature": "hot"},
            400,
            "temperature: must be a number",
            id="bad-temperature",
        ),
        pytest.param(
            {"messages": user("hi"), "seed": 2**64},
            400,
            "seed: 18446744073709551616 is outside",
            id="seed-2^64",
        ),
        pytest.param(
            {"messages": user("hi"), "presence_penalty": 9},
            400,
            "presence_penalty: 9 is outside",
            id="penalty",
        ),
        pytest.param(
            {"messages": user("word " * 3000)}, 400, "messages: the prompt is", id="prompt-over-context"
        ),
        pytest.param(
            {"messages": user("word " * 3000), "stream": True},
            400,
            "messages: the prompt is",
            id="prompt-over-context-stream",
        ),
    ],
)
def test_bad_input_is_4xx_naming_the_field(api, raw, status, message):
    got, body = chat(api, raw)
    assert got == status, body
    assert body["error"]["message"].startswith(message), body
    ok, good = chat(api, {"messages": user("still serving?"), "max_tokens": 2})
    assert ok == 200 and good["chatfleet"]["fallback"] is False


def test_concurrent_bad_and_good_requests(api):
    def one(i):
        body = (
            {"messages": user(f"hi {i}"), "max_tokens": 4}
            if i % 2
            else {"messages": [{"role": "robot", "content": "x"}]}
        )
        return chat(api, body)[0]

    assert run_concurrently(one, 12) == [400, 200] * 6


def test_client_disconnect_mid_stream_frees_its_slot(api, triton):
    cancelled = metric_value(
        triton.metrics_url, "chatfleet_model_finished_total", model="chat", reason="cancelled"
    )
    body = {"messages": user("Tell me everything"), "max_tokens": 64, "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{api.url}/v1/chat/completions", json=body) as resp,
    ):
        lines = resp.iter_lines()
        next(lines)  # the role chunk
        next(lines)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        inflight = metric_value(api.metrics_url, "chatfleet_inflight_requests")
        done = metric_value(
            triton.metrics_url, "chatfleet_model_finished_total", model="chat", reason="cancelled"
        )
        if inflight == 0 and done > cancelled:
            break
        time.sleep(0.2)
    assert metric_value(api.metrics_url, "chatfleet_client_disconnects_total") >= 1
    assert metric_value(api.metrics_url, "chatfleet_inflight_requests") == 0
    # Either Triton saw the cancellation, or the row had already finished: never a stuck slot.
    ok, _ = chat(api, {"messages": user("next"), "max_tokens": 2})
    assert ok == 200


def test_api_metrics_are_exported(api):
    chat(api, {"messages": user("metrics"), "max_tokens": 3, "stream": False})
    text = httpx.get(api.metrics_url).text
    for name in (
        "chatfleet_requests_total",
        "chatfleet_request_duration_seconds_bucket",
        "chatfleet_time_to_first_token_seconds_bucket",
        "chatfleet_inter_token_latency_seconds_bucket",
        "chatfleet_tokens_per_second_bucket",
        "chatfleet_active_sessions",
        "chatfleet_breaker_state",
    ):
        assert name in text, name


def test_demo_chat_exchange(api):
    from chatfleet_platform.localruntime.demo import chat_exchange

    lines: list[str] = []
    summary = chat_exchange(api.url, lines.append, session_id=f"demo-{time.time_ns()}")
    assert summary["bad_status"] == 400 and summary["reply2"]
    assert any("history from Redis" in line for line in lines)


def test_streaming_off_refuses_stream_true_and_serves_the_rest(rt_workdir, triton, make_api_env):
    """spec.runtime.streaming: false (the operator's CHATFLEET_STREAMING=false) on a chat API over the
    same one-model Triton: `stream: true` is a 400 naming `stream`, `stream: false` is answered."""
    from chatfleet_platform.localruntime.testing import ChatApiProcess

    env = make_api_env(None, CHATFLEET_STREAMING="false")
    proc = ChatApiProcess(triton.grpc_url, env, log_path=rt_workdir / "api-nostream.log")
    try:
        api = proc.start()
        status, body = chat(api, {"messages": user("hi"), "max_tokens": 3, "stream": True})
        assert status == 400 and body["error"]["param"] == "stream", body
        assert body["error"]["type"] == "invalid_request_error"
        status, body = chat(api, {"messages": user("hi"), "max_tokens": 3})
        assert status == 200 and body["usage"]["completion_tokens"] == 3, body
        assert body["chatfleet"]["fallback"] is False
    finally:
        proc.stop()
