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

import contextlib
import json
import signal
import time

import openai
import pytest
import redis
from chatfleet_platform.localruntime.testing import RelayProcess, Replica, metric_value, model_config
from chatfleet_runtime.engine.loading import load_tokenizer
from chatfleet_runtime.launcher.tritonhome import local_repository

pytestmark = [pytest.mark.triton, pytest.mark.redis, pytest.mark.slow]

MAX_TOKENS = 400
"""Long enough that the answer is still being written when the first chunk reaches the client (the relay
has about 10 tokens of it then)."""
STALL_S = 2.0
REQUEST_TIMEOUT_S = "120"
"""The replicas' deadline: well above the whole answer's time on a busy 2-core machine (under 5 s alone
here). With the suite's 20 s a loaded run's survivor ended the rest as "length" by its deadline, short."""


@pytest.fixture(scope="module")
def long_repo(rt_workdir, tiny_model_dir):
    """A model repository whose answers may be MAX_TOKENS long."""
    config = model_config(tiny_model_dir, max_context_tokens=2048, max_new_tokens=MAX_TOKENS)
    return local_repository(rt_workdir / "repo-long", config)


@contextlib.contextmanager
def running(workdir, repo, name, env):
    replica = Replica.create(workdir, repo, name, env)
    try:
        yield replica.start()
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def survivor(rt_workdir, long_repo, redis_srv, make_api_env):
    env = make_api_env(redis_srv.url, CHATFLEET_REQUEST_TIMEOUT_SECONDS=REQUEST_TIMEOUT_S)
    with running(rt_workdir, long_repo, "survivor", env) as replica:
        yield replica


@pytest.fixture
def victim(rt_workdir, long_repo, redis_srv, make_api_env):
    env = make_api_env(redis_srv.url, CHATFLEET_REQUEST_TIMEOUT_SECONDS=REQUEST_TIMEOUT_S)
    with running(rt_workdir, long_repo, "victim", env) as replica:
        yield replica


@pytest.fixture
def make_relay(rt_workdir, victim, survivor):
    """Start a relay, the victim first in its turn (each stopped at the end)."""
    started = []

    def make():
        process = RelayProcess(
            [victim.api.url, survivor.api.url], log_path=rt_workdir / "relay.log", stall_seconds=STALL_S
        )
        started.append(process)
        return process.start()

    yield make
    for process in started:
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


def through_a_fault(make_relay, victim, eos_id, fault, attempts=3):
    """The relay, the session and the chunks of a stream that `fault` cut mid-answer. The fault must land
    while the victim is still writing: an attempt whose answer the victim finished first (no resume, nothing
    tested) is made again with the victim restarted; a cut the relay does not mend fails at once (the SDK
    raises)."""
    for attempt in range(attempts):
        if attempt:
            victim.stop()
            victim.start()
        relay = make_relay()
        sid, chunks = stream_through_a_fault(relay, victim, eos_id, fault)
        if metric_value(relay.metrics_url, "chatfleet_relay_resumes_total") > 0:
            return relay, sid, chunks
        relay.stop()
    pytest.fail(f"the victim finished the answer before the fault in all {attempts} attempts")


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


def test_a_replica_killed_mid_answer(make_relay, victim, survivor, eos_id, redis_srv):
    relay, sid, chunks = through_a_fault(make_relay, victim, eos_id, lambda v: v.signal(signal.SIGKILL))
    check_one_whole_stream(chunks, sid, redis_srv, relay, "closed")


def test_a_frozen_replica_is_left_after_the_stall_limit(make_relay, victim, survivor, eos_id, redis_srv):
    relay, sid, chunks = through_a_fault(make_relay, victim, eos_id, lambda v: v.signal(signal.SIGSTOP))
    check_one_whole_stream(chunks, sid, redis_srv, relay, "stalled")


def test_a_replica_whose_triton_dies_says_so_and_the_answer_goes_on(
    make_relay, victim, survivor, eos_id, redis_srv
):
    relay, sid, chunks = through_a_fault(
        make_relay, victim, eos_id, lambda v: v.signal(signal.SIGKILL, api=False)
    )
    check_one_whole_stream(chunks, sid, redis_srv, relay, "error_event")
