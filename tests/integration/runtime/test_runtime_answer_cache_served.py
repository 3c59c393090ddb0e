"""The answer cache over the real tritonserver: a repeated first question reaches Triton once.

Test design: a chat API with CHATFLEET_ANSWER_CACHE (as the operator sets it from
spec.runtime.answerCache) in front of the session's tritonserver on the tiny model. Triton's own count of
successful inferences (its metrics page) tells whether a request reached
the model: the second asking of a question (other case and spaces) must not move it, and must bring the
same greedy answer marked as a hit; a second turn of the same session must reach the model with the
first turn in its history.
"""

from __future__ import annotations

import pytest
from chatfleet_platform.localruntime.testing import ChatApiProcess, metric_value, post_json

pytestmark = [pytest.mark.triton, pytest.mark.redis, pytest.mark.slow]


def inferences(triton) -> float:
    """Triton's successful inference requests of the chat model so far (its own metrics page)."""
    return metric_value(triton.metrics_url, "nv_inference_request_success", model="chat")


def test_a_repeated_question_reaches_triton_once(rt_workdir, triton, redis_srv, make_api_env):
    env = make_api_env(redis_srv.url, CHATFLEET_ANSWER_CACHE="true")
    api = ChatApiProcess(triton.grpc_url, env, log_path=rt_workdir / "api-cache.log")
    try:
        api.start()
        url = f"{api.url}/v1/chat/completions"
        before = inferences(triton)
        status, first = post_json(
            url, {"messages": [{"role": "user", "content": "Opening hours?"}], "max_tokens": 6}
        )
        assert status == 200, first
        after_first = inferences(triton)
        status, again = post_json(
            url,
            {
                "messages": [{"role": "user", "content": "  opening   HOURS? "}],
                "max_tokens": 6,
                "session_id": "c-1",
            },
        )
        assert status == 200 and again["chatfleet"].get("cache") == "hit", again
        assert again["choices"][0]["message"] == first["choices"][0]["message"]
        assert after_first == before + 1 and inferences(triton) == after_first  # Triton was not asked again
        status, second = post_json(
            url,
            {
                "messages": [{"role": "user", "content": "And on Sunday?"}],
                "max_tokens": 6,
                "session_id": "c-1",
            },
        )
        assert (
            status == 200 and second["chatfleet"]["history_turns"] == 1 and "cache" not in second["chatfleet"]
        )
        assert inferences(triton) == after_first + 1
    finally:
        api.stop()
