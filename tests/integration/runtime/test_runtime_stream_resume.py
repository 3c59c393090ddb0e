"""Streams that survive their replica, with real processes: two replicas (each its own tritonserver and
chat API, over one real Redis), the stream relay in front of them, and the stock OpenAI client streaming
through it. The replica that streams is killed, frozen, or loses its Triton after the first chunk; the
client must see one stream that completes, and the dialogue's history must hold the turn once, whole.

Test design, tick by tick (each test):
  # tick 1: the client asks through the relay; the first replica in the relay's turn (the victim) streams
  # tick 2: at the first content chunk, the fault (SIGKILL of the pod's processes, SIGSTOP, Triton's SIGKILL)
  # tick 3: the client reads on: the relay continues the answer on the survivor (continue_final_message)
  # tick 4: one id, [DONE] (the SDK ends cleanly), max_tokens tokens in all; one resume in the relay's
  #         metrics, by the reason the fault gives; the turn in Redis once, with the whole answer
"""

from __future__ import annotations

import json
import os
import signal
import time

import openai
import pytest
import redis
from chatfleet_platform.localruntime.testing import (
    ChatApiProcess,
    RelayProcess,
    metric_value,
    model_config,
)
from chatfleet_runtime.engine.loading import load_tokenizer
from chatfleet_runtime.launcher.tritonhome import TritonServer, local_repository

pytestmark = [pytest.mark.triton, pytest.mark.redis, pytest.mark.slow]

MAX_TOKENS = 400
"""Long enough that the answer is still being written when the first chunk reaches the client."""
STALL_S = 2.0


class Replica:
    """A tritonserver and its chat API: one pod's two containers."""

    def __init__(self, workdir, repo, name, env):
        self.triton = TritonServer(
            repo, home=workdir / "triton-home", log_path=workdir / f"triton-{name}.log"
        )
        self.api = ChatApiProcess("", env, log_path=workdir / f"api-{name}.log")

    def start(self):
        self.triton.start().wait_ready(180)
        self.api.triton_grpc = self.triton.grpc_url
        self.api.start()
        return self

    def signal(self, sig, *, api=True):
        """Send a signal to Triton's process group (and the chat API's): a pod killed, a node frozen."""
        for proc in [self.triton.proc, self.api.proc if api else None]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, sig)

    def stop(self):
        self.signal(signal.SIGCONT)
        self.api.stop()
        self.triton.stop()


@pytest.fixture(scope="module")
def long_repo(rt_workdir, tiny_model_dir):
    """A model repository whose answers may be MAX_TOKENS long."""
    config = model_config(tiny_model_dir, max_context_tokens=1024, max_new_tokens=MAX_TOKENS)
    return local_repository(rt_workdir / "repo-long", config)


@pytest.fixture(scope="module")
def survivor(rt_workdir, long_repo, redis_srv, make_api_env):
    replica = Replica(rt_workdir, long_repo, "survivor", make_api_env(redis_srv.url))
    try:
        yield replica.start()
    finally:
        replica.stop()


@pytest.fixture
def victim(rt_workdir, long_repo, redis_srv, make_api_env):
    replica = Replica(rt_workdir, long_repo, "victim", make_api_env(redis_srv.url))
    try:
        yield replica.start()
    finally:
        replica.stop()


@pytest.fixture
def relay(rt_workdir, victim, survivor):
    """The relay, the victim first in its turn."""
    process = RelayProcess(
        [victim.api.url, survivor.api.url], log_path=rt_workdir / "relay.log", stall_seconds=STALL_S
    )
    try:
        yield process.start()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def eos_id(tiny_model_dir):
    return load_tokenizer(tiny_model_dir).eos_token_id


def stream_through_a_fault(relay, victim, eos_id, fault):
    """Stream one answer with the OpenAI SDK; `fault(victim)` at the first content chunk. The chunks."""
    client = openai.OpenAI(base_url=f"{relay.url}/v1", api_key="unused", max_retries=0, timeout=120)
    sid = f"resume-{time.time_ns()}"
    stream = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        logit_bias={str(eos_id): -100},  # no early end: the answer is MAX_TOKENS long
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"session_id": sid},
    )
    chunks, faulted = [], False
    for chunk in stream:  # an APIError here is a stream that did not complete
        chunks.append(chunk)
        if not faulted and chunk.choices and chunk.choices[0].delta.content:
            fault(victim)
            faulted = True
    return sid, chunks


def check_one_whole_stream(chunks, sid, redis_srv, relay, reason):
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert {c.id for c in chunks} == {chunks[0].id}
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert metric_value(relay.metrics_url, "chatfleet_relay_resumes_total", reason=reason) == 1
    assert metric_value(relay.metrics_url, "chatfleet_relay_streams_total", outcome="completed") == 1
    store = redis.Redis.from_url(redis_srv.url)
    turns = [json.loads(t) for t in store.lrange(f"chatfleet:session:tiny-chat:{sid}", 0, -1)]
    assert len(turns) == 1 and turns[0]["reply"] == text
    assert turns[0]["messages"] == [{"role": "user", "content": "Tell me a long story."}]


def test_a_replica_killed_mid_answer(relay, victim, survivor, eos_id, redis_srv):
    sid, chunks = stream_through_a_fault(relay, victim, eos_id, lambda v: v.signal(signal.SIGKILL))
    check_one_whole_stream(chunks, sid, redis_srv, relay, "closed")


def test_a_frozen_replica_is_left_after_the_stall_limit(relay, victim, survivor, eos_id, redis_srv):
    sid, chunks = stream_through_a_fault(relay, victim, eos_id, lambda v: v.signal(signal.SIGSTOP))
    check_one_whole_stream(chunks, sid, redis_srv, relay, "stalled")


def test_a_replica_whose_triton_dies_says_so_and_the_answer_goes_on(
    relay, victim, survivor, eos_id, redis_srv
):
    sid, chunks = stream_through_a_fault(relay, victim, eos_id, lambda v: v.signal(signal.SIGKILL, api=False))
    check_one_whole_stream(chunks, sid, redis_srv, relay, "error_event")
