"""Dialogues know their revision: each stored turn names the revision that answered it, a turn answered
by another revision than the previous one counts a switch, and every answer says how much history it
got (`chatfleet.history_turns`, `previous_revision`); open dialogues are a gauge.

Test design: two (or three) chat APIs with different revisions share one fake Redis, as the pods of two
revisions share the real one; the fake backend of test_runtime_chat_api answers.
"""

from __future__ import annotations

import json

import pytest
from chatfleet_runtime.chat.api import ApiSettings, create_app
from fastapi.testclient import TestClient
from test_runtime_chat_api import FakeBackend, metric, post
from test_runtime_sessions import FakePipeline, FakeRedis


class Fleet:
    """Chat APIs by revision over one shared fake Redis."""

    def __init__(self, redis, history_turns=5, **settings):
        self.redis, self.history_turns, self.settings, self.clients = redis, history_turns, settings, {}

    def pod(self, revision):
        """The chat API of a revision (None: a pod that does not know its revision)."""
        if revision not in self.clients:
            settings = ApiSettings(
                model_name="m1",
                revision=revision,
                history_turns=self.history_turns,
                max_new_tokens=50,
                **self.settings,
            )
            client = TestClient(create_app(settings, backend=FakeBackend(), redis_client=self.redis))
            self.clients[revision] = client.__enter__()
        return self.clients[revision]

    def turn(self, revision, text, sid="d-1", stream=False):
        """One turn of dialogue `sid` answered by the pod of `revision`: its `chatfleet` object."""
        body = {"messages": [{"role": "user", "content": text}], "session_id": sid, "stream": stream}
        r = post(self.pod(revision), body)
        assert r.status_code == 200, r.text
        if not stream:
            return r.json()["chatfleet"]
        chunks = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        infos = [c["chatfleet"] for c in chunks]
        assert all(i == infos[0] for i in infos)  # every chunk carries the same head
        return infos[0]

    def switches(self, revision):
        return metric(self.pod(revision), "chatfleet_dialogue_revision_switches_total", model="m1")

    def close(self):
        for client in self.clients.values():
            client.__exit__(None, None, None)


@pytest.fixture
def fleet():
    f = Fleet(FakeRedis())
    yield f
    f.close()


def stored(redis, sid="d-1"):
    return [json.loads(x) for x in redis.lists[f"chatfleet:session:m1:{sid}"]]


def test_each_stored_turn_names_the_revision_that_answered_it(fleet):
    fleet.turn("r1", "q1")
    fleet.turn("r2", "q2", stream=True)
    fleet.turn(None, "q3")
    assert [t["revision"] for t in stored(fleet.redis)] == ["r1", "r2", None]
    assert [t["reply"] for t in stored(fleet.redis)] == ["echo: q1", "one two three", "echo: q3"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_switch_counter_moves_only_on_a_real_switch(fleet, stream):
    fleet.turn("r1", "q1", stream=stream)  # the first turn: nothing to switch from
    fleet.turn("r1", "q2", stream=stream)  # same revision
    assert (fleet.switches("r1"), fleet.switches("r2")) == (0, 0)
    fleet.turn("r2", "q3", stream=stream)  # r1 -> r2
    fleet.turn("r2", "q4", stream=stream)
    assert (fleet.switches("r1"), fleet.switches("r2")) == (0, 1)
    fleet.turn("r1", "q5", stream=stream)  # back: r2 -> r1, counted by the pod that took it
    assert (fleet.switches("r1"), fleet.switches("r2")) == (1, 1)
    fleet.turn("r2", "other", sid="d-2", stream=stream)  # another dialogue's first turn
    assert fleet.switches("r2") == 1


def test_no_switch_when_either_revision_is_unknown(fleet):
    fleet.turn(None, "q1")
    fleet.turn("r1", "q2")  # the previous turn's revision is unknown
    fleet.turn(None, "q3")  # this pod's revision is unknown
    fleet.turn("r1", "q4")
    assert fleet.switches("r1") == 0 and fleet.switches(None) == 0


def test_a_switch_is_counted_once_when_the_turn_is_kept_only_in_the_replicas_copy(fleet):
    """A turn Redis could not store is still in the answering replica's copy: the dialogue moved (its next
    turn there reads it, and the copy is put back in Redis), so the switch counts then, and only then."""
    fleet.turn("r1", "q1")
    healthy = fleet.redis.pipeline

    class WriteFails(FakePipeline):
        async def execute(self):
            raise ConnectionError("redis write failed")

    fleet.redis.pipeline = lambda transaction=True: WriteFails(fleet.redis)
    info = fleet.turn("r2", "q2")  # read the r1 turn, answered, kept in r2's copy only
    assert (info["history_turns"], info["previous_revision"]) == (1, "r1")
    assert fleet.switches("r2") == 1
    fleet.redis.pipeline = healthy
    info = fleet.turn("r2", "q3")  # r2's copy is newer than Redis: put back, r2 -> r2
    assert (info["history"], info["history_turns"], info["previous_revision"]) == ("restored", 2, "r2")
    assert [t["reply"] for t in stored(fleet.redis)] == ["echo: q1", "echo: q2", "echo: q3"]
    assert fleet.switches("r2") == 1


def test_a_turn_kept_nowhere_counts_no_switch():
    f = Fleet(FakeRedis(), history_turns=0)
    try:
        f.turn("r1", "q1")
        f.turn("r2", "q2")
        assert f.switches("r2") == 0
    finally:
        f.close()


def test_no_switch_when_redis_cannot_be_read(fleet):
    fleet.turn("r1", "q1")
    fleet.redis.down = True
    info = fleet.turn("r2", "q2")
    assert (info["history"], info["history_turns"]) == ("unavailable", 0)
    assert "previous_revision" not in info and fleet.switches("r2") == 0


def test_every_answer_says_how_much_history_it_got():
    f = Fleet(FakeRedis(), history_turns=2)
    try:
        infos = [f.turn("r1" if i < 2 else "r2", f"q{i}", stream=i % 2 == 1) for i in range(4)]
        assert [(i["history"], i["history_turns"], i.get("previous_revision")) for i in infos] == [
            ("ok", 0, None),
            ("ok", 1, "r1"),
            ("ok", 2, "r1"),  # the window: at most history_turns turns
            ("ok", 2, "r2"),
        ]
        no_session = post(f.pod("r1"), {"messages": [{"role": "user", "content": "hi"}]}).json()["chatfleet"]
        assert (no_session["history"], no_session["history_turns"]) == ("none", 0)
        assert "previous_revision" not in no_session
    finally:
        f.close()


def test_a_lost_history_shows_in_history_turns(fleet):
    fleet.turn("r1", "q1")
    fleet.turn("r1", "q2")
    fleet.redis.lists.clear()  # Redis lost the dialogue (flushed, expired, failed over)
    info = fleet.turn("r2", "q3")  # a replica with no copy of it
    assert (info["history"], info["history_turns"]) == ("ok", 0)  # turn 3 got 0 < min(2, 5) turns back


def test_the_replica_that_answered_a_dialogue_gives_back_what_redis_lost(fleet):
    fleet.turn("r1", "q1")
    fleet.turn("r1", "q2")
    fleet.redis.lists.clear()  # Redis restarted with nothing kept
    info = fleet.turn("r1", "q3")
    assert (info["history"], info["history_turns"]) == ("restored", 2)
    assert metric(fleet.pod("r1"), "chatfleet_session_history_from_replica_total", source="restored") == 1
    assert [t["reply"] for t in stored(fleet.redis)] == ["echo: q1", "echo: q2", "echo: q3"]


def test_open_dialogues_gauge_counts_turns_within_the_idle_window():
    now = [0.0]
    settings = ApiSettings(
        model_name="m1", max_new_tokens=50, session_ttl_s=3600, dialogue_idle_s=60, revision="r1"
    )
    app = create_app(settings, backend=FakeBackend(), clock=lambda: now[0])
    with TestClient(app) as c:
        for sid, at in (("a", 0.0), ("b", 50.0)):
            now[0] = at
            post(c, {"messages": [{"role": "user", "content": "q"}], "session_id": sid})
        now[0] = 100.0
        assert metric(c, "chatfleet_open_dialogues", model="m1") == 1
        assert metric(c, "chatfleet_active_sessions", model="m1") == 2
        now[0] = 111.0
        assert metric(c, "chatfleet_open_dialogues", model="m1") == 0


def test_a_streamed_turn_is_stored_before_its_done_event():
    """A client sends its next turn as soon as it reads [DONE]: the turn must be in Redis by then."""
    import asyncio

    from chatfleet_runtime.chat import responses
    from chatfleet_runtime.chat.pipeline import ChatPipeline

    redis = FakeRedis()
    pipeline = ChatPipeline(
        ApiSettings(model_name="m1", revision="r1", max_new_tokens=50), FakeBackend(), redis
    )
    body = {"messages": [{"role": "user", "content": "hi"}], "session_id": "d-9", "stream": True}

    async def stored_when_done():
        reply = await pipeline.chat(json.dumps(body).encode(), {})
        async for event in reply.events:
            if event == responses.DONE:
                return len(redis.lists.get("chatfleet:session:m1:d-9", []))
        return None

    assert asyncio.run(stored_when_done()) == 1
