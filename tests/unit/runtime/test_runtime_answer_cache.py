"""The chat API's answer cache (spec.runtime.answerCache) with a fake Triton backend.

Test design: the backend counts its calls, so a question answered from the cache is one Triton never
saw. Each rule of the cache is one test: the same first-turn question (normalised) is answered once by
the model, then from memory, streamed or not, marked as such and saved to the session; a later turn, a
sampled request, another revision's pod, the release analysis's requests, a fallback and a TTL past are
never served from it; the size bound drops the least recently used. Without the setting nothing is kept.
"""

from __future__ import annotations

import json

import pytest
from chatfleet_runtime.chat.answercache import AnswerCache, normalise
from chatfleet_runtime.chat.api import ApiSettings, create_app
from fastapi.testclient import TestClient
from test_runtime_chat_api import FakeBackend
from test_runtime_sessions import FakeRedis

METRICS = "http://testserver:8090"


def app_client(backend, redis=None, **settings):
    base = {"model_name": "m1", "request_timeout_s": 0.5, "max_new_tokens": 50, "revision": "r1"}
    return TestClient(create_app(ApiSettings(**{**base, **settings}), backend=backend, redis_client=redis))


def ask(client, question, *, stream=False, history=None, headers=None, **body):
    messages = [*(history or []), {"role": "user", "content": question}]
    r = client.post(
        "/v1/chat/completions",
        content=json.dumps({"model": "m1", "messages": messages, "stream": stream, **body}),
        headers=headers or {},
    )
    assert r.status_code == 200, r.text
    return r


def text_of(r) -> str:
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        parts = [
            json.loads(line[6:])["choices"][0]["delta"].get("content", "")
            for line in r.text.splitlines()
            if line.startswith("data: {")
        ]
        assert r.text.rstrip().endswith("data: [DONE]")
        return "".join(parts)
    return r.json()["choices"][0]["message"]["content"]


def test_a_repeated_first_question_is_answered_once_by_the_model():
    backend = FakeBackend()
    with app_client(backend, answer_cache=True) as client:
        first = ask(client, "What are your opening hours?")
        again = ask(client, "  what are your   OPENING hours? ")
        assert len(backend.calls) == 1
        assert text_of(again) == text_of(first) == "echo: What are your opening hours?"
        assert first.headers["x-chatfleet-cache"] == "miss"
        assert again.headers["x-chatfleet-cache"] == "hit" and again.json()["chatfleet"]["cache"] == "hit"
        assert "cache" not in first.json()["chatfleet"]
        assert again.json()["usage"] == first.json()["usage"]
        metrics = client.get(f"{METRICS}/metrics").text
        assert 'chatfleet_answer_cache_requests_total{model="m1",result="hit"} 1.0' in metrics
        assert 'chatfleet_answer_cache_requests_total{model="m1",result="miss"} 1.0' in metrics
        assert 'chatfleet_answer_cache_entries{model="m1"} 1.0' in metrics


def test_a_streamed_question_is_kept_and_served_as_a_stream():
    backend = FakeBackend()
    with app_client(backend, answer_cache=True) as client:
        first = ask(client, "hours?", stream=True)
        again = ask(client, "hours?", stream=True)
        plain = ask(client, "hours?")  # the same question not streamed: the same kept answer
        assert len(backend.calls) == 1
        assert text_of(first) == text_of(again) == text_of(plain) == "one two three"
        assert again.headers["x-chatfleet-cache"] == "hit"
        assert '"finish_reason": "length"' in again.text  # as the model ended it


def test_a_hit_is_saved_to_the_session_like_a_generated_answer():
    backend = FakeBackend()
    with app_client(backend, FakeRedis(), answer_cache=True) as client:
        ask(client, "hours?", session_id="s-1")
        ask(client, "hours?", session_id="s-2")  # from the cache
        second_turn = ask(client, "and on Sunday?", session_id="s-2")
        assert len(backend.calls) == 2  # the second turn has history: asked of the model, with it
        seen = backend.calls[-1][0]
        assert [m["content"] for m in seen] == ["hours?", "echo: hours?", "and on Sunday?"]
        assert second_turn.json()["chatfleet"]["history_turns"] == 1


@pytest.mark.parametrize(
    ("why", "kw"),
    [
        pytest.param(
            "a later turn",
            {"history": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            id="later-turn",
        ),
        pytest.param("sampled", {"temperature": 0.7}, id="sampled"),
        pytest.param("the quality gate", {"headers": {"X-Chatfleet-Quality": "true"}}, id="quality-gate"),
        pytest.param("the traffic probe", {"headers": {"X-Chatfleet-Probe": "true"}}, id="probe"),
        pytest.param("no-cache", {"headers": {"Cache-Control": "no-cache"}}, id="no-cache"),
    ],
)
def test_what_is_never_answered_from_the_cache(why, kw):
    backend = FakeBackend()
    with app_client(backend, answer_cache=True) as client:
        r1 = ask(client, "hours?", **kw)
        r2 = ask(client, "hours?", **kw)
        assert len(backend.calls) == 2, why
        assert "x-chatfleet-cache" not in r2.headers and "cache" not in r2.json()["chatfleet"]
        assert text_of(r1) == text_of(r2)


def test_sampled_answers_are_kept_when_the_spec_says_so():
    backend = FakeBackend()
    with app_client(backend, answer_cache=True, answer_cache_sampled=True) as client:
        ask(client, "hours?", temperature=0.7)
        ask(client, "hours?", temperature=0.7)
        ask(client, "hours?", temperature=0.9)  # other sampling settings: another question
        assert len(backend.calls) == 2


def test_a_fallback_is_never_kept():
    backend = FakeBackend()
    backend.mode = "down"
    with app_client(backend, answer_cache=True, breaker_failures=10) as client:
        assert ask(client, "hours?").json()["chatfleet"]["fallback"] is True
        backend.mode = "ok"
        r = ask(client, "hours?")
        assert text_of(r) == "echo: hours?" and len(backend.calls) == 2


def test_each_revision_keeps_its_own_answers_and_the_cache_is_off_by_default():
    key = AnswerCache().key
    msgs, params = [{"role": "user", "content": "q"}], {"temperature": 0.0, "max_tokens": 5}
    assert key(msgs, params, 0, "r1", "m1") != key(msgs, params, 0, "r2", "m1")
    backend = FakeBackend()
    with app_client(backend) as client:  # no answer_cache: every question reaches the model
        r = ask(client, "hours?")
        ask(client, "hours?")
    assert len(backend.calls) == 2 and "x-chatfleet-cache" not in r.headers


def test_ttl_and_size_bound():
    now = [0.0]
    cache = AnswerCache(ttl_s=10, max_entries=2, clock=lambda: now[0])
    cache.put("a", "A", "stop", 1, 1)
    cache.put("b", "B", "stop", 1, 1)
    assert cache.get("a").text == "A"  # a is now the most recently used
    cache.put("c", "C", "stop", 1, 1)
    assert cache.get("b") is None and len(cache) == 2  # b, the least recently used, went
    now[0] = 10.0
    assert cache.get("a") is None and cache.get("c") is None  # past the TTL: never served
    assert len(cache) == 0


def test_the_answers_kept_stay_within_the_byte_bound():
    cache = AnswerCache(max_entries=100, max_bytes=10)
    cache.put("a", "12345", "stop", 1, 1)
    cache.put("b", "67890", "stop", 1, 1)
    cache.put("c", "xyz", "stop", 1, 1)  # 13 bytes: a, the least recently used, goes
    assert cache.get("a") is None and cache.get("b").text == "67890" and len(cache) == 2
    cache.put("d", "x" * 11, "stop", 1, 1)  # larger than the bound: not kept, nothing else lost
    assert cache.get("d") is None and len(cache) == 2
    cache.put("b", "1", "stop", 1, 1)  # kept again: its old size is given back
    cache.put("e", "123456", "stop", 1, 1)
    assert len(cache) == 3


def test_the_question_is_normalised_but_the_system_prompt_is_not():
    key = AnswerCache().key
    params = {"temperature": 0.0}
    q = [{"role": "user", "content": "Opening  hours?"}]
    assert normalise("\uff2fpening\thours?") == "opening hours?"  # a full-width O, a tab
    assert key(q, params, 0, "r", "m") == key(
        [{"role": "user", "content": "opening hours?"}], params, 0, "r", "m"
    )
    polite = [{"role": "system", "content": "Be polite."}, *q]
    brief = [{"role": "system", "content": "Be brief."}, *q]
    assert key(polite, params, 0, "r", "m") != key(brief, params, 0, "r", "m")
    assert key(q, params, 1, "r", "m") is None  # stored history: not a first turn
