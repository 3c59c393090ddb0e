"""The Triton model served by the real tritonserver: HTTP and gRPC clients, streaming, batching, errors.

The repository holds one model, ``chat``, decoupled: every gRPC call is a stream (``stream: false`` gets
one final response with the whole text), and over HTTP ``generate`` takes ``stream: false`` while
``generate_stream`` streams. Triton refuses unary ``infer`` on a decoupled model (tested below).
"""

from __future__ import annotations

import json
import queue
import time
import urllib.request

import numpy as np
import pytest
from chatfleet_platform.localruntime.testing import metric_value, model_config, run_concurrently
from chatfleet_runtime.launcher.tritonhome import TritonServer, local_repository

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def inputs(mod, messages, params=None):
    a = mod.InferInput("MESSAGES", [1, 1], "BYTES")
    a.set_data_from_numpy(np.array([[json.dumps(messages).encode()]], dtype=np.object_))
    b = mod.InferInput("PARAMETERS", [1, 1], "BYTES")
    b.set_data_from_numpy(np.array([[json.dumps(params or {}).encode()]], dtype=np.object_))
    return [a, b]


USER = [{"role": "user", "content": "Hello there"}]


class Stream:
    """One gRPC client with its stream open to the chat model; responses land in a queue."""

    def __init__(self, url: str):
        import tritonclient.grpc as grpcclient

        self.mod = grpcclient
        self.q: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))

    def send(self, messages, params) -> Stream:
        self.client.async_stream_infer("chat", inputs(self.mod, messages, params))
        return self

    def next(self, timeout: float = 60):
        """(text, finish reason, num tokens) of the next response; raises its error."""
        result, error = self.q.get(timeout=timeout)
        if error is not None:
            raise error
        text = result.as_numpy("TEXT")[0].decode("utf-8", "replace")
        return text, result.as_numpy("FINISH_REASON")[0].decode(), int(result.as_numpy("NUM_TOKENS")[0])

    def answer(self, timeout: float = 60) -> tuple[list[str], str, int]:
        """Every text up to the final response: (texts, finish reason, num tokens)."""
        texts = []
        while True:
            text, finish, tokens = self.next(timeout)
            texts.append(text)
            if finish:
                return texts, finish, tokens

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def ask(url: str, messages, params) -> tuple[list[str], str, int]:
    """One request on its own stream: (texts, finish reason, num tokens)."""
    stream = Stream(url)
    try:
        return stream.send(messages, params).answer()
    finally:
        stream.close()


def generate(triton, messages, params, endpoint: str = "generate") -> bytes:
    """Triton's HTTP generate extension on the chat model."""
    req = urllib.request.Request(
        f"{triton.http_url}/v2/models/chat/{endpoint}",
        data=json.dumps({"MESSAGES": json.dumps(messages), "PARAMETERS": json.dumps(params)}).encode(),
    )
    return urllib.request.urlopen(req, timeout=30).read()


def test_the_server_loads_exactly_one_model(triton):
    """One engine per replica, one copy of the weights: Triton's repository index is `chat` alone."""
    req = urllib.request.Request(f"{triton.http_url}/v2/repository/index", data=b"{}")
    index = json.loads(urllib.request.urlopen(req, timeout=10).read())
    assert [(m["name"], m.get("state")) for m in index] == [("chat", "READY")]
    config = json.loads(urllib.request.urlopen(f"{triton.http_url}/v2/models/chat/config", timeout=10).read())
    assert config["model_transaction_policy"]["decoupled"] is True


def test_http_and_grpc_give_the_same_greedy_answer(triton):
    """HTTP `generate` with `stream: false` and a gRPC stream give the same greedy text."""
    http = json.loads(generate(triton, USER, {"max_tokens": 6, "stream": False}))
    texts, finish, tokens = ask(triton.grpc_url, USER, {"max_tokens": 6, "stream": False})
    assert http["TEXT"] == texts[0] != "" and len(texts) == 1
    assert (http["NUM_TOKENS"], http["FINISH_REASON"]) == (tokens, finish) == (6, "length")


def test_unary_infer_is_refused_on_the_decoupled_model(triton):
    """Triton's own rule for decoupled models: unary gRPC and HTTP infer are refused, nothing is run."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    g = grpcclient.InferenceServerClient(triton.grpc_url)
    h = httpclient.InferenceServerClient(triton.http_url.removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException, match="decoupled"):
            g.infer("chat", inputs(grpcclient, USER, {"max_tokens": 2, "stream": False}))
        with pytest.raises(InferenceServerException, match="decoupled"):
            h.infer("chat", inputs(httpclient, USER, {"max_tokens": 2, "stream": False}))
    finally:
        g.close()
        h.close()


def test_generate_extension_over_http(triton):
    body = json.loads(generate(triton, USER, {"max_tokens": 3, "stream": False}))
    assert body["NUM_TOKENS"] == 3
    events = generate(triton, USER, {"max_tokens": 3}, endpoint="generate_stream").decode()
    chunks = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: ")]
    assert "".join(c["TEXT"] for c in chunks) == body["TEXT"] and chunks[-1]["FINISH_REASON"] == "length"
    # every delta says the tokens so far and the prompt's (the chat API's continuous usage, the relay's resume)
    counts = [c["NUM_TOKENS"] for c in chunks]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 3
    assert {c["PROMPT_TOKENS"] for c in chunks} == {body["PROMPT_TOKENS"]}


def test_grpc_stream_sends_deltas_then_final(triton):
    texts, finish, _ = ask(triton.grpc_url, USER, {"max_tokens": 8})
    assert finish == "length" and len(texts) >= 3 and texts[-1] == ""
    full = json.loads(generate(triton, USER, {"max_tokens": 8, "stream": False}))
    assert full["TEXT"] == "".join(texts)


@pytest.mark.parametrize(
    ("messages", "params", "message"),
    [
        pytest.param(
            [{"role": "robot", "content": "x"}], {}, "messages[0].role: 'robot' is not one of", id="role"
        ),
        pytest.param(
            USER, {"max_tokens": 10_000}, "max_tokens: 10000 is more than the limit 64", id="tokens"
        ),
        pytest.param(
            [{"role": "user", "content": "word " * 2000}], {}, "messages: the prompt is", id="context"
        ),
        pytest.param(USER, {"session_id": "bad id!"}, "session_id: must be 1-128", id="session"),
        pytest.param(USER, {"seed": 2**64}, "seed: 18446744073709551616 is outside", id="seed"),
    ],
)
def test_bad_input_is_an_error_response_and_server_keeps_serving(triton, messages, params, message):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(
        InferenceServerException,
        match="invalid_request: " + message.replace("[", r"\[").replace("]", r"\]"),
    ):
        ask(triton.grpc_url, messages, {**params, "stream": False})
    assert ask(triton.grpc_url, USER, {"max_tokens": 2, "stream": False})[2] == 2


def eos_biased_away(model_dir) -> dict:
    """PARAMETERS that keep greedy decoding off EOS, so an answer runs to its max_tokens."""
    from transformers import AutoTokenizer

    return {"logit_bias": {str(AutoTokenizer.from_pretrained(model_dir).eos_token_id): -100}}


def test_a_non_streamed_request_joins_a_running_stream_in_the_same_batch(triton, tiny_model_dir):
    """The one model serves both kinds through one in-flight batch: a `stream: false` request sent while a
    long stream runs joins that running batch (a join at 2 rows), finishes while the stream still runs,
    and answers what it answers alone.

    The long stream is 64 tokens, about 0.1 s on the tiny model: on a loaded machine it can end before the
    short request reaches the engine at all, which says nothing about batching. Such a try (the stream's
    final response came before the short answer) is inconclusive and is tried again, at most three times;
    an engine that never lets a request join a running batch (static batching) makes every try so, and the
    test fails saying it never joined."""
    no_eos = eos_biased_away(tiny_model_dir)
    other = [{"role": "user", "content": "A short one, please"}]
    alone = ask(triton.grpc_url, other, {**no_eos, "max_tokens": 3, "stream": False})
    tries = []
    for _ in range(3):
        rows = metric_value(triton.metrics_url, "chatfleet_model_batch_size_sum", model="chat")
        joins = metric_value(triton.metrics_url, "chatfleet_model_batch_size_count", model="chat")
        long, short = Stream(triton.grpc_url), Stream(triton.grpc_url)
        try:
            long.send(USER, {**no_eos, "max_tokens": 64})
            first = [long.next()]  # the stream is running: its first delta came
            assert first[0][1] == "", first
            short.send(other, {**no_eos, "max_tokens": 3, "stream": False})
            answer = short.answer()
            # Was the long stream still at work when the short answer was done (no final response yet)?
            so_far = []
            while not long.q.empty():
                so_far.append(long.next())
            ended_first = any(finish for _, finish, _ in so_far)
            _, finish, tokens = so_far[-1] if ended_first else long.answer()
        finally:
            long.close()
            short.close()
        assert answer == alone and len(answer[0]) == 1  # one final response, the same text as alone
        assert (finish, tokens) == ("length", 64)
        tries.append(len(so_far))
        if not ended_first:
            break
    else:
        pytest.fail(
            f"in 3 tries the stream ended before the short request was answered: it never joined {tries}"
        )
    grown_rows = metric_value(triton.metrics_url, "chatfleet_model_batch_size_sum", model="chat") - rows
    grown_joins = metric_value(triton.metrics_url, "chatfleet_model_batch_size_count", model="chat") - joins
    # Two joins (1 row, then 2 rows), or one join of both: either way a batch of 2 rows.
    assert (grown_joins, grown_rows) in ((2, 3), (1, 2)), (grown_joins, grown_rows)


@pytest.fixture(scope="module")
def static_triton(rt_workdir, tiny_model_dir):
    """A second tritonserver whose chat model runs in static mode (`inflight_batching: false`)."""
    cfg = model_config(
        tiny_model_dir,
        max_context_tokens=512,
        max_new_tokens=64,
        extra_parameters={"inflight_batching": "false"},
    )
    repo = local_repository(rt_workdir / "repo-static", cfg)
    server = TritonServer(repo, home=rt_workdir / "triton-home", log_path=rt_workdir / "triton-static.log")
    try:
        server.start().wait_ready(180)
        yield server
    finally:
        server.stop()


def batch_stats(triton, model="chat") -> dict[int, int]:
    stats = json.loads(urllib.request.urlopen(f"{triton.http_url}/v2/models/{model}/stats", timeout=5).read())
    return {b["batch_size"]: int(b["compute_infer"]["count"]) for b in stats["model_stats"][0]["batch_stats"]}


def settled_stats(triton) -> dict[int, int]:
    """Batch statistics once the previous tests' last executions have been recorded."""
    previous = batch_stats(triton)
    for _ in range(20):
        time.sleep(0.25)
        current = batch_stats(triton)
        if current == previous:
            return current
        previous = current
    return previous


def test_static_mode_forms_dynamic_batches_of_streamed_and_plain_requests(static_triton):
    """`inflight_batching: false` still works in the decoupled model: 16 concurrent requests, half
    streamed, half `stream: false`, run as Triton dynamic batches (executions of more than one request),
    one batched generate each, and every request gets its answer."""
    triton = static_triton
    before = settled_stats(triton)
    rows_before = metric_value(triton.metrics_url, "chatfleet_model_batch_size_sum", model="chat")
    execs_before = metric_value(triton.metrics_url, "chatfleet_model_batch_size_count", model="chat")

    def one(i):
        msgs = [{"role": "user", "content": f"concurrent request {i}"}]
        texts, _, tokens = ask(triton.grpc_url, msgs, {"max_tokens": 16, "stream": bool(i % 2)})
        return tokens, len(texts) > 1

    assert run_concurrently(one, 16) == [(16, bool(i % 2)) for i in range(16)]
    # Triton records an execution's statistics just after it releases the responses: poll briefly.
    deadline = time.monotonic() + 10
    while True:
        after = batch_stats(triton)
        grown = {size: after.get(size, 0) - before.get(size, 0) for size in after}
        if sum(size * n for size, n in grown.items()) >= 16 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sum(size * n for size, n in grown.items()) == 16, grown
    assert max(size for size, n in grown.items() if n > 0) > 1, grown
    rows = metric_value(triton.metrics_url, "chatfleet_model_batch_size_sum", model="chat") - rows_before
    execs = metric_value(triton.metrics_url, "chatfleet_model_batch_size_count", model="chat") - execs_before
    assert rows == 16 and execs < 16


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_poisoned_request_never_fails_its_batch(triton, stream):
    """Bad requests (a seed torch refuses, out-of-range numbers, a token id outside the vocabulary) sent
    at the same moment as good ones: every good one is answered, every bad one gets its own error."""
    bad_params = [
        {"seed": 2**64, "temperature": 1.0},
        {"temperature": float("inf")},
        {"logit_bias": {"99999999": 1}},
        {"top_p": float("nan")},
    ]

    def one(i):
        params = {"max_tokens": 4} if i % 2 else bad_params[(i // 2) % len(bad_params)]
        try:
            return "ok", ask(triton.grpc_url, USER, {**params, "stream": stream})[2]
        except Exception as exc:
            return "error", str(exc)

    answers = run_concurrently(one, 16)
    for i, (kind, detail) in enumerate(answers):
        if i % 2:
            assert (kind, detail) == ("ok", 4), (i, detail)
        else:
            assert kind == "error" and "invalid_request: " in detail, (i, detail)


def test_without_stream_one_final_response_carries_the_whole_text(triton):
    """`stream: false` (how the chat API sends non-streaming requests, so they join the running batch):
    no deltas, one final response whose text is the streamed answer's."""
    stream = Stream(triton.grpc_url)
    try:
        text, finish, tokens = stream.send(USER, {"max_tokens": 8, "stream": False}).next(30)
        time.sleep(0.2)
        assert stream.q.empty()  # nothing after the final response
    finally:
        stream.close()
    streamed, _, _ = ask(triton.grpc_url, USER, {"max_tokens": 8})
    assert (finish, tokens) == ("length", 8) and text == "".join(streamed) != ""
