"""The Triton model served by the real tritonserver: HTTP and gRPC clients, streaming, batching, errors."""

from __future__ import annotations

import json
import queue
import time
import urllib.request

import numpy as np
import pytest
from chatfleet_platform.localruntime.testing import metric_value, run_concurrently

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def inputs(mod, messages, params=None):
    a = mod.InferInput("MESSAGES", [1, 1], "BYTES")
    a.set_data_from_numpy(np.array([[json.dumps(messages).encode()]], dtype=np.object_))
    b = mod.InferInput("PARAMETERS", [1, 1], "BYTES")
    b.set_data_from_numpy(np.array([[json.dumps(params or {}).encode()]], dtype=np.object_))
    return [a, b]


USER = [{"role": "user", "content": "Hello there"}]


def test_http_and_grpc_give_the_same_greedy_answer(triton):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    h = httpclient.InferenceServerClient(triton.http_url.removeprefix("http://"))
    g = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        rh = h.infer("chat", inputs(httpclient, USER, {"max_tokens": 6}))
        rg = g.infer("chat", inputs(grpcclient, USER, {"max_tokens": 6}))
    finally:
        h.close()
        g.close()
    assert rh.as_numpy("TEXT")[0] == rg.as_numpy("TEXT")[0]
    assert rh.as_numpy("NUM_TOKENS")[0] == 6 and rh.as_numpy("FINISH_REASON")[0] == b"length"


def test_generate_extension_over_http(triton):
    req = urllib.request.Request(
        f"{triton.http_url}/v2/models/chat/generate",
        data=json.dumps({"MESSAGES": json.dumps(USER), "PARAMETERS": json.dumps({"max_tokens": 3})}).encode(),
    )
    body = json.loads(urllib.request.urlopen(req, timeout=30).read())
    assert body["NUM_TOKENS"] == 3


def test_grpc_stream_sends_deltas_then_final(triton):
    import tritonclient.grpc as grpcclient

    q: queue.Queue = queue.Queue()
    g = grpcclient.InferenceServerClient(triton.grpc_url)
    g.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        g.async_stream_infer("chat_stream", inputs(grpcclient, USER, {"max_tokens": 8}))
        texts, finish = [], ""
        while not finish:
            result, error = q.get(timeout=30)
            assert error is None
            texts.append(result.as_numpy("TEXT")[0].decode())
            finish = result.as_numpy("FINISH_REASON")[0].decode()
    finally:
        g.stop_stream()
        g.close()
    assert finish == "length" and len(texts) >= 3 and texts[-1] == ""
    full = urllib.request.urlopen(
        urllib.request.Request(
            f"{triton.http_url}/v2/models/chat/generate",
            data=json.dumps(
                {"MESSAGES": json.dumps(USER), "PARAMETERS": json.dumps({"max_tokens": 8})}
            ).encode(),
        ),
        timeout=30,
    ).read()
    assert json.loads(full)["TEXT"] == "".join(texts)


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
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    g = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        with pytest.raises(
            InferenceServerException,
            match="invalid_request: " + message.replace("[", r"\[").replace("]", r"\]"),
        ):
            g.infer("chat", inputs(grpcclient, messages, params))
        assert g.infer("chat", inputs(grpcclient, USER, {"max_tokens": 2})).as_numpy("NUM_TOKENS")[0] == 2
    finally:
        g.close()


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


def test_dynamic_batches_form_under_concurrency(triton):
    """16 concurrent gRPC clients: Triton's statistics show executions with more than one request."""
    import tritonclient.grpc as grpcclient

    before = settled_stats(triton)
    rows_before = metric_value(triton.metrics_url, "chatfleet_model_batch_size_sum", model="chat")
    execs_before = metric_value(triton.metrics_url, "chatfleet_model_batch_size_count", model="chat")

    def one(i):
        g = grpcclient.InferenceServerClient(triton.grpc_url)
        try:
            msgs = [{"role": "user", "content": f"concurrent request {i}"}]
            return int(
                g.infer("chat", inputs(grpcclient, msgs, {"max_tokens": 16})).as_numpy("NUM_TOKENS")[0]
            )
        finally:
            g.close()

    assert run_concurrently(one, 16) == [16] * 16
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


@pytest.mark.parametrize("model", ["chat", "chat_stream"])
def test_a_poisoned_request_never_fails_its_batch(triton, model):
    """Bad requests (a seed torch refuses, out-of-range numbers, a token id outside the vocabulary) sent
    at the same moment as good ones: every good one is answered, every bad one gets its own error."""
    import tritonclient.grpc as grpcclient

    bad_params = [
        {"seed": 2**64, "temperature": 1.0},
        {"temperature": float("inf")},
        {"logit_bias": {"99999999": 1}},
        {"top_p": float("nan")},
    ]

    def unary(params):
        g = grpcclient.InferenceServerClient(triton.grpc_url)
        try:
            return "ok", int(g.infer("chat", inputs(grpcclient, USER, params)).as_numpy("NUM_TOKENS")[0])
        except Exception as exc:
            return "error", str(exc)
        finally:
            g.close()

    def streamed(params):
        q: queue.Queue = queue.Queue()
        g = grpcclient.InferenceServerClient(triton.grpc_url)
        g.start_stream(callback=lambda result, error: q.put((result, error)))
        try:
            g.async_stream_infer("chat_stream", inputs(grpcclient, USER, params))
            while True:
                result, error = q.get(timeout=60)
                if error is not None:
                    return "error", str(error)
                if result.as_numpy("FINISH_REASON")[0]:
                    return "ok", int(result.as_numpy("NUM_TOKENS")[0])
        finally:
            g.stop_stream()
            g.close()

    def one(i):
        params = {"max_tokens": 4} if i % 2 else bad_params[(i // 2) % len(bad_params)]
        return (unary if model == "chat" else streamed)(params)

    answers = run_concurrently(one, 16)
    for i, (kind, detail) in enumerate(answers):
        if i % 2:
            assert (kind, detail) == ("ok", 4), (i, detail)
        else:
            assert kind == "error" and "invalid_request: " in detail, (i, detail)


def test_decoupled_model_without_stream_sends_one_final_response_with_the_whole_text(triton):
    """`stream: false` on chat_stream (how the chat API sends non-streaming requests, so they join the
    running batch): no deltas, one final response whose text is the batched model's answer."""
    import tritonclient.grpc as grpcclient

    q: queue.Queue = queue.Queue()
    g = grpcclient.InferenceServerClient(triton.grpc_url)
    g.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        g.async_stream_infer("chat_stream", inputs(grpcclient, USER, {"max_tokens": 8, "stream": False}))
        result, error = q.get(timeout=30)
        assert error is None
        plain = g.infer("chat", inputs(grpcclient, USER, {"max_tokens": 8}))
    finally:
        g.stop_stream()
        g.close()
    assert result.as_numpy("FINISH_REASON")[0] == b"length"
    assert result.as_numpy("NUM_TOKENS")[0] == 8
    assert result.as_numpy("TEXT")[0] == plain.as_numpy("TEXT")[0] != b""
    assert q.empty()
