"""Precision through the real stack: an int8 model served by tritonserver answers chats through the chat
API, and the precision that runs is visible (fp16 asked on a CPU pod runs, and says, fp32).

Test design: each precision gets its own tritonserver over the tiny model (the production loader
quantises it at `initialize`), and a chat API that re-exports Triton's metrics, as in the pod.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from chatfleet_platform.localruntime.testing import ChatApiProcess, metric_value, model_config, post_json
from chatfleet_runtime.engine.termination import TERMINATION_LOG_ENV
from chatfleet_runtime.launcher.tritonhome import TritonServer, local_repository

pytestmark = [pytest.mark.triton, pytest.mark.slow]


@pytest.fixture(scope="module", params=["int8", "fp16"])
def served(request, rt_workdir, tiny_model_dir, make_api_env):
    """(precision asked, chat API) for a Triton loading the tiny model in that precision on CPU."""
    precision = request.param
    base = rt_workdir / f"precision-{precision}"
    repo = local_repository(
        base / "repo",
        # The random tiny model's int8 agreement is about 0.96 (nearly flat logits): 0.9 lets it serve.
        model_config(
            tiny_model_dir,
            precision=precision,
            max_context_tokens=512,
            max_new_tokens=32,
            int8_min_agreement=0.9,
        ),
    )
    triton = TritonServer(repo, home=rt_workdir / "triton-home", log_path=base / "triton.log")
    api = None
    try:
        triton.start().wait_ready(180)
        env = make_api_env(None, CHATFLEET_TRITON_METRICS_URL=triton.metrics_url)
        api = ChatApiProcess(triton.grpc_url, env, log_path=base / "api.log").start()
        yield precision, api
    finally:
        if api is not None:
            api.stop()
        triton.stop()


def test_chat_is_served_and_the_precision_that_runs_is_exported(served):
    asked, api = served
    status, body = post_json(
        f"{api.url}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hello in int8?"}], "max_tokens": 6},
    )
    assert status == 200, body
    assert body["chatfleet"]["fallback"] is False and body["usage"]["completion_tokens"] == 6
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST",
            f"{api.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "stream"}], "max_tokens": 5, "stream": True},
        ) as resp,
    ):
        events = [json.loads(x[6:]) for x in resp.iter_lines() if x.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == 5 and "fallback" not in resp.headers
    runs = {"int8": "int8", "fp16": "fp32"}[asked]  # fp16 is not served on CPU: fp32 runs, and says so
    labels = {"model": "chat", "requested": asked, "precision": runs, "device": "cpu"}  # the one model
    assert metric_value(api.metrics_url, "chatfleet_model_precision_info", **labels) == 1


def test_int8_below_its_agreement_threshold_never_turns_ready_and_says_why(
    rt_workdir, tiny_model_dir, monkeypatch
):
    """The failing check: tritonserver exits before it is ready, the termination message names the agreement."""
    import time

    base = rt_workdir / "precision-int8-refused"
    log = base / "termination-log"
    base.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(log))  # /dev/termination-log in a pod
    prompts = json.dumps(["How do I reset my password?", "What is 17 times 23?", "Write a haiku about rain."])
    repo = local_repository(
        base / "repo",
        model_config(
            tiny_model_dir,
            precision="int8",
            max_context_tokens=512,
            max_new_tokens=32,
            calibration_prompts=prompts,
            int8_min_agreement=0.999,
        ),
    )
    triton = TritonServer(repo, home=rt_workdir / "triton-home", log_path=base / "triton.log")
    try:
        triton.start()
        with pytest.raises(RuntimeError, match="tritonserver exited"):
            triton.wait_ready(180)
        assert not triton.ready()
        deadline = time.monotonic() + 10
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        message = log.read_text()
    finally:
        triton.stop()
    found = re.search(r"^precision check failed: int8 agreement (0\.\d+) < 0\.999 \(", message)
    assert found and float(found[1]) < 0.999, message
    assert "3 prompts from spec.runtime.calibration.prompts (3)); not serving" in message
    assert "int8 agreement" in (base / "triton.log").read_text()  # and in the container's log
