"""Streams that survive their replica: the chat API's side (a cut stream says so; a request continues an
answer another replica began, and the turn is saved once, whole) and the relay's (one client stream spliced
from several replicas' streams).

Test design: the chat API runs with the fake backend of test_runtime_chat_api and the fake Redis of
test_runtime_sessions; the relay runs over httpx's MockTransport, whose handlers play replicas that stream,
break, stall or refuse. The real processes (two chat APIs over two Tritons, a relay, a SIGKILL) are in
tests/integration/runtime/test_runtime_stream_resume.py.
"""

from __future__ import annotations

import asyncio
import json
import socketserver
import threading
import time

import httpx
import pytest
from chatfleet_runtime.chat.api import ApiSettings, create_app
from chatfleet_runtime.chat.backend import Chunk
from chatfleet_runtime.prompting import RequestError, parse_continuation, render_prompt
from chatfleet_runtime.relay import server as relay_server
from chatfleet_runtime.relay.splice import Cut, Progress, resume_body
from fastapi.testclient import TestClient
from test_runtime_chat_api import FakeBackend, metric, post
from test_runtime_sessions import FakeRedis

U = [{"role": "user", "content": "count to three"}]


def events(text: str) -> list[str]:
    return [part[6:] for part in text.split("\n\n") if part.startswith("data: ")]


@pytest.fixture
def backend():
    return FakeBackend()


@pytest.fixture
def redis():
    return FakeRedis()


@pytest.fixture
def client(backend, redis):
    settings = ApiSettings(model_name="m1", request_timeout_s=0.5, max_new_tokens=50, fallback_text="busy")
    with TestClient(create_app(settings, backend=backend, redis_client=redis)) as c:
        yield c


# --- the chat API -----------------------------------------------------------------------------------------


def test_a_stream_cut_by_the_model_ends_with_an_error_event_not_a_finished_answer(client, backend):
    backend.mode = "cut"
    r = post(client, {"messages": U, "stream": True})
    data = events(r.text)
    assert r.status_code == 200 and "[DONE]" not in data
    last = json.loads(data[-1])
    assert last["error"]["code"] == "stream_cut" and "incomplete" in last["error"]["message"]
    assert not any(json.loads(d).get("choices", [{}])[0].get("finish_reason") for d in data[:-1])
    assert metric(client, "chatfleet_requests_total", outcome="error", stream="true") == 1


def test_a_request_that_continues_an_answer_reaches_the_model_as_one(client, backend):
    body = {
        "messages": [*U, {"role": "assistant", "content": "one "}],
        "continue_final_message": True,
        "stream": True,
    }
    r = post(client, body)
    assert r.status_code == 200 and events(r.text)[-1] == "[DONE]"
    messages, params = backend.calls[-1]
    assert (
        messages[-1] == {"role": "assistant", "content": "one "} and params["continue_final_message"] is True
    )
    post(client, {"messages": U})
    assert "continue_final_message" not in backend.calls[-1][1]


def test_a_continued_answer_is_saved_once_and_whole(client, redis):
    body = {
        "messages": [*U, {"role": "assistant", "content": "zero "}],
        "continue_final_message": True,
        "session_id": "d-1",
        "stream": True,
    }
    assert post(client, body).status_code == 200
    [saved] = [json.loads(t) for t in redis.lists["chatfleet:session:m1:d-1"]]
    assert saved["messages"] == U and saved["reply"] == "zero one two three"


def test_a_replica_that_cannot_continue_says_503_not_a_fallback_text(client, backend):
    backend.mode = "down"
    body = {"messages": [*U, {"role": "assistant", "content": "one "}], "continue_final_message": True}
    r = post(client, {**body, "stream": True})
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "busy" not in r.text
    assert "continue_final_message" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "last_role", "message"),
    [
        pytest.param({}, "assistant", "messages[1].role: the last message must be from user", id="no-flag"),
        pytest.param(
            {"continue_final_message": "yes"}, "assistant", "continue_final_message: must be", id="type"
        ),
        pytest.param(
            {"continue_final_message": True, "add_generation_prompt": True},
            "assistant",
            "add_generation_prompt: must be false",
            id="both",
        ),
        pytest.param(
            {"add_generation_prompt": False}, "user", "add_generation_prompt: false is", id="gen-off"
        ),
        pytest.param(
            {"continue_final_message": True}, "user", "continue_final_message needs the final", id="user-last"
        ),
    ],
)
def test_bad_continuations_are_refused_naming_the_field(client, extra, last_role, message):
    messages = [*U, {"role": "assistant", "content": "one"}] if last_role == "assistant" else U
    r = post(client, {"messages": messages, **extra})
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_usage_in_every_chunk_when_asked(client):
    body = {"messages": U, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    chunks = [json.loads(d) for d in events(post(client, body).text) if d != "[DONE]"]
    assert [("usage" in c) for c in chunks] == [False, True, True, True, True]  # role, 3 words, the end
    plain = [
        json.loads(d) for d in events(post(client, {**body, "stream_options": {}}).text) if d != "[DONE]"
    ]
    assert [("usage" in c) for c in plain] == [False, False, False, False, True]
    r = post(client, {**body, "stream_options": {"continuous_usage_stats": 1}})
    assert r.status_code == 400 and "stream_options.continuous_usage_stats" in r.text


class SlowBackend(FakeBackend):
    """Streams its words `gap` seconds apart (a busy replica between two tokens)."""

    def __init__(self, gap):
        super().__init__()
        self.gap, self.closed = gap, 0

    async def stream(self, messages, params, timeout):
        self.calls.append((messages, params))
        try:
            for word in ("one ", "two ", "three"):
                yield Chunk(word)
                await asyncio.sleep(self.gap)
            yield Chunk("", "stop", 3, prompt_tokens=7)
        finally:
            self.closed += 1


@pytest.fixture
def slow():
    backend = SlowBackend(gap=0.35)
    settings = ApiSettings(model_name="m1", request_timeout_s=10, max_new_tokens=50, fallback_text="busy")
    with TestClient(create_app(settings, backend=backend)) as c:
        yield c, backend


def test_a_slow_stream_that_asks_for_heartbeats_gets_comments_between_its_chunks_and_nothing_else(slow):
    client, _ = slow
    body = {"messages": U, "stream": True}
    asked = post(client, body, headers={"X-Chatfleet-Heartbeat-Seconds": "0.1"})
    plain = post(client, body)
    assert asked.status_code == plain.status_code == 200
    beats = [p for p in asked.text.split("\n\n") if p.startswith(":")]
    assert beats and set(beats) == {": heartbeat"}, asked.text
    assert ": heartbeat" not in plain.text  # nobody gets them unasked
    strip = lambda d: [json.loads(e)["choices"][0]["delta"] for e in d if e != "[DONE]"]  # noqa: E731
    assert strip(events(asked.text)) == strip(events(plain.text))  # the same answer, chunk for chunk
    assert events(asked.text)[-1] == "[DONE]"


def test_a_client_gone_while_heartbeats_go_out_closes_the_model_stream_once(slow):
    client, backend = slow
    with client.stream(
        "POST",
        "/v1/chat/completions",
        content=json.dumps({"messages": U, "stream": True}),
        headers={"X-Chatfleet-Heartbeat-Seconds": "0.1"},
    ) as r:
        for line in r.iter_lines():
            if line.startswith(":"):
                break  # gone while the next chunk is awaited
    deadline = time.monotonic() + 5
    while backend.closed < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.closed == 1
    assert metric(client, "chatfleet_client_disconnects_total") == 1
    assert post(client, {"messages": U, "stream": True}).status_code == 200  # and the API serves on


class SlowSave(FakeRedis):
    """A store whose writes take 0.5 s (a Redis restarting: the store retries for seconds)."""

    def pipeline(self, transaction=True):
        pipe = super().pipeline(transaction)
        execute = pipe.execute

        async def slow():
            await asyncio.sleep(0.5)
            await execute()

        pipe.execute = slow
        return pipe


def test_heartbeats_go_on_while_the_turn_is_saved_and_the_turn_is_saved_before_done():
    """Before this, the save before [DONE] was silent: with Redis restarting, the relay (stall limit 1.5 s)
    took it for a silent replica, sent [DONE] itself (the answer was whole) and closed the stream, and the
    save was cancelled: bench-chaos counted 44 turns answered and not in the history."""
    store = SlowSave()
    settings = ApiSettings(model_name="m1", request_timeout_s=10, max_new_tokens=50, fallback_text="busy")
    with TestClient(create_app(settings, backend=SlowBackend(gap=0.0), redis_client=store)) as client:
        r = post(
            client,
            {"messages": U, "stream": True, "session_id": "s1"},
            headers={"X-Chatfleet-Heartbeat-Seconds": "0.1"},
        )
    parts = [p for p in r.text.split("\n\n") if p]
    finish = next(
        i for i, p in enumerate(parts) if '"finish_reason": "stop"' in p or '"finish_reason":"stop"' in p
    )
    assert parts[-1] == "data: [DONE]"
    assert ": heartbeat" in parts[finish + 1 : -1], parts  # between the last chunk and [DONE]: the save
    assert sum(len(v) for v in store.lists.values()) >= 1  # and the turn is saved


@pytest.mark.parametrize("value", ["0", "fast", "31", "-1"])
def test_a_bad_heartbeat_header_is_refused_naming_it(client, value):
    r = post(client, {"messages": U, "stream": True}, headers={"X-Chatfleet-Heartbeat-Seconds": value})
    assert r.status_code == 400 and "X-Chatfleet-Heartbeat-Seconds" in r.text


def test_parse_continuation_is_off_by_default():
    assert parse_continuation({"add_generation_prompt": True}, U) is False
    with pytest.raises(RequestError, match="add_generation_prompt: must be true or false"):
        parse_continuation({"add_generation_prompt": 1}, U)


def test_the_prompt_of_a_continuation_ends_inside_the_answer(tokenizer):
    messages = [*U, {"role": "assistant", "content": "one two"}]
    prompt = render_prompt(
        tokenizer, messages, max_context_tokens=512, max_new_tokens=16, continue_final=True
    )
    text = tokenizer.decode(prompt.ids)
    assert text.rstrip().endswith("one two"), text
    plain = render_prompt(tokenizer, U, max_context_tokens=512, max_new_tokens=16)
    assert tokenizer.decode(plain.ids) in text  # the conversation, then the answer's beginning


def test_a_continuation_keeps_its_question_when_the_context_is_short(tokenizer):
    old = [{"role": "user", "content": "word " * 60}, {"role": "assistant", "content": "reply " * 60}]
    messages = [*old, *U, {"role": "assistant", "content": "one"}]
    prompt = render_prompt(
        tokenizer, messages, max_context_tokens=120, max_new_tokens=16, continue_final=True
    )
    text = tokenizer.decode(prompt.ids)
    assert "count to three" in text and "word" not in text and text.rstrip().endswith("one")


# --- the splice (pure) ------------------------------------------------------------------------------------


def chunk(content=None, *, role=False, finish=None, id_="a", usage=None):
    delta = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    out = {"id": id_, "created": 1 if id_ == "a" else 2, "choices": [{"index": 0, "delta": delta}]}
    out["choices"][0]["finish_reason"] = finish
    if usage:
        out["usage"] = usage
    return out


def test_a_resumed_stream_reads_as_the_first():
    p = Progress()
    assert p.rewrite(chunk("", role=True))["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    p.rewrite(chunk("one "))
    p.rewrite(chunk("two "))
    p.begin_resume()
    assert p.rewrite(chunk("", role=True, id_="b")) is None  # the second stream's opening repeats nothing
    out = p.rewrite(chunk("three", id_="b"))
    assert (out["id"], out["created"], out["choices"][0]["delta"]) == ("a", 1, {"content": "three"})
    end = p.rewrite(
        chunk(finish="stop", id_="b", usage={"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10})
    )
    assert end["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12} and p.finished
    assert p.answer == "one two three" and p.resumes == 1


def test_an_error_event_is_a_cut_never_passed_on():
    with pytest.raises(Cut, match="part-way") as exc:
        Progress().rewrite({"error": {"message": "the model failed part-way", "code": "stream_cut"}})
    assert exc.value.reason == "error_event"


def test_the_resume_request_continues_the_answer_and_leaves_the_original_alone():
    body = {"messages": list(U), "max_completion_tokens": 2, "add_generation_prompt": True, "stream": True}
    again = resume_body(body, Progress(text=["one ", "two ", "three"], tokens=3))
    assert again["messages"][-1] == {"role": "assistant", "content": "one two three"}
    assert again["max_completion_tokens"] == 1 and "add_generation_prompt" not in again
    assert body["messages"] == U and body["add_generation_prompt"] is True


# --- the relay --------------------------------------------------------------------------------------------


def sse_bytes(*chunks, done=True) -> list[bytes]:
    out = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
    return [*out, b"data: [DONE]\n\n"] if done else out


class Replica:
    """A replica behind MockTransport: streams its chunks, then (as told) finishes, breaks, stalls or sends
    the chat API's stream_cut event; or refuses with a status."""

    def __init__(self, name, words=("one ", "two "), end="done", status=200):
        self.name, self.words, self.end, self.status, self.bodies = name, words, end, status, []
        self.headers: list[httpx.Headers] = []

    async def stream(self):
        """Each word is two tokens, said in the chunk's usage (continuous_usage_stats, as the relay asks)."""
        words = [
            chunk(
                w,
                id_=self.name,
                usage={"prompt_tokens": 5, "completion_tokens": 2 * n, "total_tokens": 5 + 2 * n},
            )
            for n, w in enumerate(self.words, 1)
        ]
        for b in sse_bytes(chunk("", role=True, id_=self.name), *words, done=False):
            yield b
            await asyncio.sleep(0)
        if self.end == "done":
            used = {
                "prompt_tokens": 5,
                "completion_tokens": 2 * len(self.words),
                "total_tokens": 5 + 2 * len(self.words),
            }
            for b in sse_bytes(chunk(finish="stop", id_=self.name, usage=used)):
                yield b
        elif self.end == "break":
            raise httpx.ReadError("connection reset by peer")
        elif self.end == "stall":
            await asyncio.sleep(30)
        elif self.end == "slow":  # a slow last token, heartbeats meanwhile (as the chat API sends when asked)
            for _ in range(10):
                await asyncio.sleep(0.1)
                yield b": heartbeat\n\n"
            yield sse_bytes(chunk("three", id_=self.name))[0]
            yield sse_bytes(chunk(finish="stop", id_=self.name))[0]
            yield b"data: [DONE]\n\n"
        elif self.end == "error_event":
            yield b'data: {"error": {"message": "the model failed part-way", "code": "stream_cut"}}\n\n'

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        self.headers.append(request.headers)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": f"{self.name} says no"}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self.stream())


def relay_client(*replicas, stall_s=5.0, max_resumes=3):
    by_host = {f"http://{r.name}": r for r in replicas}

    def handler(request: httpx.Request):
        return by_host[f"http://{request.url.host}"](request)

    relay = relay_server.Relay(
        relay_server.Upstreams(list(by_host)),
        stall_s=stall_s,
        max_resumes=max_resumes,
        client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    return relay, TestClient(relay_server.create_app(relay))


def relayed(client, body=None):
    r = client.post("/v1/chat/completions", json=body or {"messages": U, "stream": True, "max_tokens": 10})
    data = events(r.text)
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    text = "".join((c.get("choices") or [{}])[0].get("delta", {}).get("content") or "" for c in chunks)
    return r, data, chunks, text


def counter(relay, name, **labels):
    value = relay.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


@pytest.mark.parametrize("end", ["break", "stall", "error_event"])
def test_a_cut_stream_is_continued_on_another_replica_as_one_stream(end):
    a, b = Replica("a", end=end), Replica("b", words=("three",))
    relay, client = relay_client(a, b, stall_s=0.3)
    with client:
        r, data, chunks, text = relayed(client)
    assert r.status_code == 200 and data[-1] == "[DONE]" and text == "one two three"
    assert {c["id"] for c in chunks} == {"a"} and sum("role" in c["choices"][0]["delta"] for c in chunks) == 1
    assert [("usage" in c) for c in chunks] == [False] * 4 + [True]  # per-chunk usage: not asked
    assert chunks[-1]["usage"]["completion_tokens"] == 4 + 2  # a's 2 words, b's 1, 2 tokens each
    resumed = b.bodies[-1]
    assert resumed["continue_final_message"] is True and resumed["max_tokens"] == 10 - 4
    assert resumed["stream_options"] == {"continuous_usage_stats": True} == a.bodies[-1]["stream_options"]
    assert resumed["messages"] == [*U, {"role": "assistant", "content": "one two "}]
    reason = {"break": "closed", "stall": "stalled", "error_event": "error_event"}[end]
    assert counter(relay, "chatfleet_relay_resumes_total", reason=reason) == 1
    assert counter(relay, "chatfleet_relay_resume_gap_seconds_count") == 1
    assert counter(relay, "chatfleet_relay_streams_total", outcome="completed") == 1


def test_a_replica_that_refuses_before_streaming_is_skipped_and_a_bad_request_is_not():
    a, b = Replica("a", status=503), Replica("b", words=("hi",))
    relay, client = relay_client(a, b)
    with client:
        r, data, _, text = relayed(client)
        assert r.status_code == 200 and text == "hi" and data[-1] == "[DONE]"
        assert counter(relay, "chatfleet_relay_retries_total") == 1
        a.status = b.status = 400
        r = client.post("/v1/chat/completions", json={"messages": U, "stream": True})
        assert r.status_code == 400 and "says no" in r.text and len(a.bodies) + len(b.bodies) == 3


def test_when_no_replica_can_continue_the_client_gets_the_cut_never_a_finished_answer():
    a, b = Replica("a", end="break"), Replica("b", end="break")
    relay, client = relay_client(a, b)
    with client:
        _, data, chunks, _ = relayed(client)
    assert "[DONE]" not in data and chunks[-1]["error"]["code"] == "stream_cut"
    assert counter(relay, "chatfleet_relay_streams_total", outcome="cut") == 1


def test_an_answer_finished_before_the_cut_only_gets_its_done():
    a = Replica("a", end="break")
    relay, client = relay_client(a, Replica("b"))

    async def finished_then_broken():
        for b in sse_bytes(chunk("", role=True), chunk("hi"), chunk(finish="stop"), done=False):
            yield b
        raise httpx.ReadError("reset")

    a.stream = finished_then_broken
    with client:
        _, data, _, text = relayed(client)
    assert (
        data[-1] == "[DONE]"
        and text == "hi"
        and counter(relay, "chatfleet_relay_resumes_total", reason="closed") == 0
    )


def test_an_unreachable_replica_is_skipped_for_requests_not_streamed():
    b = Replica("b")

    def handler(request: httpx.Request):
        if request.url.host == "a":
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    relay = relay_server.Relay(
        relay_server.Upstreams(["http://a", "http://b"]),
        client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    with TestClient(relay_server.create_app(relay)) as client:
        for _ in range(2):  # whichever the round robin tries first
            r = client.post("/v1/chat/completions", json={"messages": U})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    assert not b.bodies


def test_the_docstring_examples_hold():
    import doctest

    from chatfleet_runtime import prompting
    from chatfleet_runtime.relay import replicas, splice

    for module in (splice, prompting, replicas):
        failed, tried = doctest.testmod(module)
        assert tried and not failed, module.__name__


def test_resolve_turns_a_name_into_every_address_and_a_failed_replica_goes_last():
    clock = [0.0]
    upstreams = relay_server.Upstreams(["http://localhost:8080"], resolve=True, clock=lambda: clock[0])
    urls = asyncio.run(upstreams.order(set()))
    assert "http://127.0.0.1:8080" in urls and all(u.endswith(":8080") for u in urls)
    plain = relay_server.Upstreams(["http://a", "http://b", "http://c"], clock=lambda: clock[0])
    plain.failed("http://a")
    assert asyncio.run(plain.order(set())) == ["http://b", "http://c", "http://a"]
    clock[0] = 10.0  # past the cooldown: back in its turn
    assert asyncio.run(plain.order(set()))[0] == "http://b"
    assert asyncio.run(plain.order(set(), advance=False))[0] == "http://c"


def test_through_a_balancer_a_cut_stream_is_resumed_through_it_again():
    """--balanced: the one upstream is a Service's ClusterIP. Behind it, the replica that held the stream
    died (its connections refused until it leaves the Service), the next connection reaches a live one."""
    a, b = Replica("a", end="break"), Replica("b", words=("three",))
    behind = iter([a, "refused", "refused", b])

    def balancer(request: httpx.Request):
        nxt = next(behind)
        if nxt == "refused":
            raise httpx.ConnectError("connection refused")
        return nxt(request)

    upstreams = relay_server.Upstreams(["http://bot-replicas"], balanced=True, balanced_pause_s=0.01)
    relay = relay_server.Relay(
        upstreams,
        stall_s=5.0,
        max_resumes=3,
        client=httpx.AsyncClient(transport=httpx.MockTransport(balancer)),
    )
    with TestClient(relay_server.create_app(relay)) as client:
        r, data, _, text = relayed(client)
    assert r.status_code == 200 and data[-1] == "[DONE]" and text == "one two three"
    assert b.bodies[-1]["messages"] == [*U, {"role": "assistant", "content": "one two "}]
    assert counter(relay, "chatfleet_relay_resumes_total", reason="closed") == 1
    assert counter(relay, "chatfleet_relay_retries_total") == 2


def test_balanced_takes_one_upstream_only():
    with pytest.raises(SystemExit):
        relay_server.main(["--balanced", "--upstream=http://a", "--upstream=http://b"])


def test_heartbeats_keep_a_slow_stream_from_being_taken_for_a_silent_replica():
    """The relay asks for heartbeats (a quarter of its stall limit) and counts them as bytes: a last token
    1 s in coming, with a stall limit of 0.3 s, is no stall; the client never sees the comments."""
    a, b = Replica("a", end="slow"), Replica("b", words=("never",))
    relay, client = relay_client(a, b, stall_s=0.4)
    with client:
        r, data, _, text = relayed(client)
        assert a.headers[-1]["x-chatfleet-heartbeat-seconds"] == "0.1"
        client.post("/v1/chat/completions", json={"messages": U})  # not streamed: nothing to ask for
    assert r.status_code == 200 and data[-1] == "[DONE]" and text == "one two three"
    assert ": heartbeat" not in r.text and b.bodies == [{"messages": U}]  # b: only the request not streamed
    assert "x-chatfleet-heartbeat-seconds" not in b.headers[-1]
    assert counter(relay, "chatfleet_relay_resumes_total", reason="stalled") == 0


class _Replicas(socketserver.ThreadingTCPServer):
    daemon_threads = allow_reuse_address = True


def raw_replica(answer: bytes | None) -> tuple[_Replicas, str]:
    """A replica on 127.0.0.1 that reads the request and answers `answer` (a whole HTTP response), or, with
    None, holds the connection and says nothing: a node gone silent before its answer began."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            length = 0
            while (line := self.rfile.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            self.rfile.read(length)
            if answer is None:
                self.rfile.read()  # until the relay gives up and closes
                return
            self.wfile.write(answer)

    server = _Replicas(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_replica_silent_before_its_answer_began_is_left_for_the_next_after_the_first_byte_limit():
    body = b"".join(
        sse_bytes(chunk("", role=True, id_="b"), chunk("hi", id_="b"), chunk(finish="stop", id_="b"))
    )
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    silent, silent_url = raw_replica(None)
    good, good_url = raw_replica(answer)
    try:
        relay = relay_server.Relay(relay_server.Upstreams([silent_url, good_url]), first_byte_s=0.5)
        with TestClient(relay_server.create_app(relay)) as client:
            t0 = time.monotonic()
            r, data, _, text = relayed(client)
            took = time.monotonic() - t0
    finally:
        silent.shutdown()
        good.shutdown()
    assert r.status_code == 200 and text == "hi" and data[-1] == "[DONE]"
    assert counter(relay, "chatfleet_relay_retries_total") == 1
    assert took < 30  # bounded by the limit, not by the silent replica (which never answers)


# --- dialogues stay on their replica ----------------------------------------------------------------------


def test_the_chat_api_names_its_address_to_the_relay_only(client):
    """The local end of the connection (the pod's IP behind a Service; TestClient's is testserver:80)."""
    asked = post(client, {"messages": U, "stream": True}, headers={"X-Chatfleet-Relay": "1"})
    plain = post(client, {"messages": U, "stream": True})
    assert asked.headers["x-chatfleet-replica"] == "testserver:80"
    assert "x-chatfleet-replica" not in plain.headers


class Named(Replica):
    """A replica at an IP address that names itself in X-Chatfleet-Replica, as the chat API does."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        resp = super().__call__(request)
        if request.headers.get("x-chatfleet-relay"):
            resp.headers["X-Chatfleet-Replica"] = f"{self.name}:8080"
        return resp


def dialogue_relay(replicas, *, balancer=None):
    """A relay over replicas by IP (`Named`), or over a balancer URL whose handler picks one per request;
    each request's host is recorded."""
    by_host = {r.name: r for r in replicas}
    hosts: list[str] = []

    def handler(request: httpx.Request):
        hosts.append(request.url.host)
        return (
            (balancer or by_host.__getitem__)(request)
            if request.url.host == "bot-replicas"
            else by_host[request.url.host](request)
        )

    urls = ["http://bot-replicas"] if balancer else [f"http://{r.name}:8080" for r in replicas]
    relay = relay_server.Relay(
        relay_server.Upstreams(urls, balanced=balancer is not None, balanced_pause_s=0.01),
        stall_s=5.0,
        client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    return relay, TestClient(relay_server.create_app(relay)), hosts


def turn(client, session):
    return relayed(client, {"messages": U, "stream": True, "max_tokens": 10, "session_id": session})


def test_a_dialogues_turns_go_to_the_replica_that_answered_its_last_turn():
    """Round robin alone would send each next request to the other replica: a, b, a, b, a."""
    a, b = Named("10.0.0.1"), Named("10.0.0.2")
    relay, client, hosts = dialogue_relay([a, b])
    with client:
        answers = [turn(client, "s1")[0] for _ in range(3)] + [turn(client, "s2")[0] for _ in range(2)]
    assert hosts == ["10.0.0.1"] * 3 + ["10.0.0.2"] * 2
    assert {r.status_code for r in answers} == {200}
    assert not any("x-chatfleet-replica" in r.headers for r in answers)  # the client never sees the address
    assert counter(relay, "chatfleet_relay_dialogue_turns_total", placed="new") == 2
    assert counter(relay, "chatfleet_relay_dialogue_turns_total", placed="kept") == 3


def test_through_a_balancer_the_next_turn_goes_to_the_replicas_address_and_moves_when_it_is_gone():
    """--balanced (a Service's ClusterIP): the first turn lands where kube-proxy sends it; the replica names
    itself, and the next turns go to that address directly. When it refuses, the turn goes through the
    balancer again and the dialogue stays where it landed."""
    a, b = Named("10.0.0.1"), Named("10.0.0.2")
    behind = iter([a, b, b])
    relay, client, hosts = dialogue_relay([a, b], balancer=lambda request: next(behind)(request))
    with client:
        turn(client, "s1")  # through the balancer: a
        turn(client, "s1")  # straight to a
        a.status = 503
        r, _, _, text = turn(client, "s1")  # a refuses: through the balancer, to b
        turn(client, "s1")  # straight to b
    assert hosts == ["bot-replicas", "10.0.0.1", "10.0.0.1", "bot-replicas", "10.0.0.2"]
    assert r.status_code == 200 and text == "one two "
    placed = {
        p: counter(relay, "chatfleet_relay_dialogue_turns_total", placed=p) for p in ("new", "kept", "moved")
    }
    assert placed == {"new": 1, "kept": 2, "moved": 1}


def test_a_resumed_stream_stays_with_the_replica_that_continued_it():
    a, b = Named("10.0.0.1", end="break"), Named("10.0.0.2", words=("three",))
    _relay, client, hosts = dialogue_relay([a, b])
    with client:
        _, data, _, text = turn(client, "s1")
        assert data[-1] == "[DONE]" and text == "one two three"
        turn(client, "s1")
    assert hosts == ["10.0.0.1", "10.0.0.2", "10.0.0.2"]


def test_the_relay_takes_no_address_from_the_client_and_keeps_only_addresses_from_replicas():
    """A client's own X-Chatfleet-Relay or X-Chatfleet-Replica is not passed on (the relay sets its own);
    a replica's header that is not an IP and a port is not kept (the next turn takes its turn)."""
    a, b = Named("10.0.0.1"), Replica("10.0.0.2")
    relay, client, _hosts = dialogue_relay([a, b])
    a_header = {"X-Chatfleet-Replica": "10.0.0.2:8080", "X-Chatfleet-Relay": "evil"}
    with client:
        client.post(
            "/v1/chat/completions",
            json={"messages": U, "stream": True, "session_id": "s1"},
            headers=a_header,
        )
    assert a.headers[-1]["x-chatfleet-relay"] == "1" and "x-chatfleet-replica" not in a.headers[-1]
    assert relay_server.replica_url("bot.example:8080") is None
    assert relay_server.replica_url("10.0.0.2:99999") is None
    key = relay_server.dialogue_key({}, {"user": "u"})
    relay.affinity.put(key, relay_server.replica_url("nonsense"))
    assert relay.affinity.get(key) is None


def test_the_dialogues_remembered_are_bounded_the_least_recently_used_forgotten_first():
    affinity = relay_server.Affinity(limit=2)
    affinity.put("a", "http://10.0.0.1:8080")
    affinity.put("b", "http://10.0.0.2:8080")
    assert affinity.get("a") == "http://10.0.0.1:8080"  # a used: b is now the oldest
    affinity.put("c", "http://10.0.0.3:8080")
    assert (len(affinity), affinity.get("b"), affinity.get("a")) == (2, None, "http://10.0.0.1:8080")


def test_through_a_balancer_a_cut_stream_resumes_straight_on_a_replica_that_answered_lately():
    """Through the balancer the resume might reach the replica that just died again (its endpoint is still
    listed until its probes fail): a replica that answered in the last seconds is tried first, directly."""
    a, b = Named("10.0.0.1"), Named("10.0.0.2", words=("three",))
    behind = iter([a, b])
    relay, client, hosts = dialogue_relay([a, b], balancer=lambda request: next(behind)(request))
    with client:
        turn(client, "s1")  # through the balancer: a
        turn(client, "s2")  # through the balancer: b
        a.end = "break"
        _, data, _, text = turn(client, "s1")  # straight to a, cut; resumed straight on b
    assert hosts == ["bot-replicas", "bot-replicas", "10.0.0.1", "10.0.0.2"]
    assert data[-1] == "[DONE]" and text == "one two three"
    assert counter(relay, "chatfleet_relay_dialogue_turns_total", placed="moved") == 1
