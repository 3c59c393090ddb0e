"""Session history: composition, sliding window, TTL, and degrading when Redis fails (fake client)."""

from __future__ import annotations

import asyncio
import json

import pytest
from chatfleet_runtime.chat.sessions import (
    ActiveSessions,
    History,
    SessionStore,
    Windows,
    compose,
    history_messages,
)


class FakePipeline:
    def __init__(self, redis):
        self.redis, self.ops = redis, []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    def rpush(self, key, *values):
        self.ops.extend(("rpush", key, value) for value in values)

    def delete(self, key):
        self.ops.append(("delete", key))

    def expireat(self, key, when):
        self.ops.append(("expireat", key, when))

    def ltrim(self, key, start, end):
        self.ops.append(("ltrim", key, start, end))

    def expire(self, key, ttl):
        self.ops.append(("expire", key, ttl))

    async def execute(self):
        if self.redis.down:
            raise ConnectionError("redis down")
        lost_reply = self.redis.fail_next.pop(0) if self.redis.fail_next else None
        if lost_reply == "before":
            raise TimeoutError("Timeout reading from socket")
        for op, key, *args in self.ops:
            if op == "rpush":
                self.redis.lists.setdefault(key, []).append(args[0])
            elif op == "ltrim":
                self.redis.lists[key] = self.redis.lists[key][args[0] :]
            elif op == "delete":
                self.redis.lists.pop(key, None)
            elif op == "expireat":
                self.redis.expire_at[key] = args[0]
            else:
                self.redis.ttl[key] = args[0]
        if lost_reply == "after":  # done on the server, the reply timed out
            raise TimeoutError("Timeout reading from socket")


class FakeRedis:
    """The three list commands and the pipeline the store uses."""

    def __init__(self):
        self.lists, self.ttl, self.expire_at, self.down = {}, {}, {}, False
        self.fail_next: list[str] = []
        """Time-outs of the next calls: "before" (nothing done) or "after" (done, the reply lost)."""

    def pipeline(self, transaction=True):
        return FakePipeline(self)

    async def lrange(self, key, start, end):
        if self.down:
            raise ConnectionError("redis down")
        if self.fail_next:
            self.fail_next.pop(0)
            raise TimeoutError("Timeout reading from socket")
        return self.lists.get(key, [])[start:]

    async def lindex(self, key, index):
        if self.down:
            raise ConnectionError("redis down")
        items = self.lists.get(key, [])
        return items[index] if items else None


def run(coro):
    return asyncio.run(coro)


def test_window_and_ttl():
    redis, errors = FakeRedis(), []
    store = SessionStore(redis, namespace="m", ttl_s=60, turns=2, on_error=errors.append)
    for i in range(3):
        assert run(store.append("s", [{"role": "user", "content": f"q{i}"}], f"a{i}"))
    history = run(store.history("s"))
    assert history.ok and [m["content"] for m in history.messages] == ["q1", "a1", "q2", "a2"]
    assert history.turns == 2
    assert redis.ttl["chatfleet:session:m:s"] == 60 and not errors


class Clock:
    """A fake clock that `sleep` advances."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_redis_down_degrades_and_reports_and_then_stops_waiting():
    redis, errors, clock = FakeRedis(), [], Clock()
    store = SessionStore(redis, on_error=errors.append, clock=clock, sleep=clock.sleep)
    redis.down = True
    assert run(store.history("s")) == History(ok=False)
    assert 4.0 <= clock.now < 4.5  # tried again for RETRY_S
    assert run(store.append("s", [{"role": "user", "content": "q"}], "a")) is True  # kept in the copy
    assert clock.now < 4.5  # within DOWN_S of the read that gave up: one try, no wait
    assert errors == ["read", "write"]
    redis.down = False
    assert run(store.append("t", [{"role": "user", "content": "q"}], "a")) is True
    redis.down = True
    clock.now += 1
    assert run(store.history("u")) == History(ok=False) and clock.now >= 9.0  # up again: full budget


def test_a_stall_of_two_and_a_half_seconds_loses_no_turn(monkeypatch):
    """The pod's Redis calls time out for 2.5 s (a loaded node: "Timeout connecting to server" on three
    writes at once in make bench-release-traffic). Before: two tries a second apart both failed and the
    dialogue's next turn was answered without this one."""
    redis, errors, clock = FakeRedis(), [], Clock()
    store = SessionStore(redis, namespace="m", on_error=errors.append, clock=clock, sleep=clock.sleep)
    stall_until = 2.5
    push = FakePipeline.execute

    async def stalled_execute(self):
        if clock.now < stall_until:
            clock.now += 1.0  # the connect time-out
            raise TimeoutError("Timeout connecting to server")
        return await push(self)

    monkeypatch.setattr(FakePipeline, "execute", stalled_execute)
    assert run(store.append("s", [{"role": "user", "content": "q0"}], "a0"))
    assert len(redis.lists["chatfleet:session:m:s"]) == 1 and errors == []
    assert run(store.history("s")).turns == 1


@pytest.mark.parametrize("when", ["before", "after"])
def test_one_time_out_loses_no_turn_and_stores_none_twice(when):
    """A write whose reply timed out once (a loaded node) is retried: the turn is stored exactly once
    whether the first try did nothing or landed; a read that timed out once is retried too. (Before: the
    turn was skipped, and the next turn of the dialogue was answered without it.)"""
    redis, errors = FakeRedis(), []
    store = SessionStore(redis, namespace="m", turns=5, on_error=errors.append)
    assert run(store.append("s", [{"role": "user", "content": "q0"}], "a0"))
    redis.fail_next = [when]
    assert run(store.append("s", [{"role": "user", "content": "q1"}], "a1"))
    redis.fail_next = ["read"]
    history = run(store.history("s"))
    assert history.ok and [m["content"] for m in history.messages] == ["q0", "a0", "q1", "a1"], history
    assert errors == []


def test_no_redis_configured():
    store = SessionStore(None)
    assert run(store.history("s")) == History(ok=False)
    assert run(store.append("s", [], "a")) is False


@pytest.mark.parametrize(
    ("request_messages", "history", "expected"),
    [
        pytest.param([{"role": "user", "content": "hi"}], [], ["user:hi"], id="no-history"),
        pytest.param(
            [{"role": "system", "content": "S"}, {"role": "user", "content": "q2"}],
            [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}],
            ["system:S", "user:q1", "assistant:a1", "user:q2"],
            id="system-first-then-history",
        ),
    ],
)
def test_compose(request_messages, history, expected):
    assert [f"{m['role']}:{m['content']}" for m in compose(request_messages, history)] == expected


def test_history_messages_skips_empty_reply():
    turns = [{"messages": [{"role": "user", "content": "q"}], "reply": ""}]
    assert history_messages(turns) == [{"role": "user", "content": "q"}]


def test_active_sessions_expire():
    now = [0.0]
    active = ActiveSessions(ttl_s=10, clock=lambda: now[0])
    active.touch("a")
    now[0] = 5
    active.touch("b")
    assert active.count() == 2
    now[0] = 12
    assert active.count() == 1


@pytest.mark.parametrize(
    ("revisions", "expected"),
    [
        pytest.param(["r1"], "r1", id="one-turn"),
        pytest.param(["r1", "r2"], "r2", id="the-last-turn-wins"),
        pytest.param(["r1", None], None, id="last-unknown"),
        pytest.param([], None, id="no-turns"),
    ],
)
def test_each_turn_records_the_revision_that_answered_it(revisions, expected):
    redis = FakeRedis()
    store = SessionStore(redis, namespace="m", turns=5)
    for i, rev in enumerate(revisions):
        assert run(store.append("s", [{"role": "user", "content": f"q{i}"}], f"a{i}", rev))
    stored = [json.loads(x)["revision"] for x in redis.lists.get("chatfleet:session:m:s", [])]
    assert stored == revisions
    history = run(store.history("s"))
    assert (history.turns, history.revision) == (len(revisions), expected)


def test_turns_stored_before_revisions_were_recorded_read_as_unknown():
    redis = FakeRedis()
    redis.lists["chatfleet:session:m:s"] = [json.dumps({"messages": [], "reply": "a"}), "not json"]
    history = run(SessionStore(redis, namespace="m").history("s"))
    assert (history.ok, history.turns, history.revision) == (True, 1, None)


def test_open_dialogues_count_within_a_shorter_window():
    now = [0.0]
    active = ActiveSessions(ttl_s=100, clock=lambda: now[0])
    active.touch("old")
    now[0] = 50
    active.touch("new")
    now[0] = 60
    assert (active.count(), active.count(within_s=30), active.count(within_s=100)) == (2, 1, 2)
    now[0] = 120  # "old" is past the TTL: pruned, whatever the window
    assert (active.count(within_s=1000), active.count()) == (1, 1)


def contents(history):
    return [m["content"] for m in history.messages]


def ask(store, sid, i):
    return run(store.append(sid, [{"role": "user", "content": f"q{i}"}], f"a{i}"))


def test_a_redis_restarted_with_nothing_kept_gets_back_the_windows_this_replica_has():
    """Redis restarted with no persistence: every list is gone. The replica that answered a dialogue puts
    its window back (one transaction, expiring when the lost one would have) and answers with it."""
    redis, sources = FakeRedis(), []
    store = SessionStore(redis, namespace="m", ttl_s=600, turns=3, on_replica=sources.append)
    for i in range(4):
        assert ask(store, "s", i)
    redis.lists.clear()  # the restart
    history = run(store.history("s"))
    assert (history.ok, history.source, contents(history)) == (
        True,
        "restored",
        ["q1", "a1", "q2", "a2", "q3", "a3"],
    )
    assert [json.loads(t)["reply"] for t in redis.lists["chatfleet:session:m:s"]] == ["a1", "a2", "a3"]
    newest = json.loads(redis.lists["chatfleet:session:m:s"][-1])["at"]
    assert newest + 600 <= redis.expire_at["chatfleet:session:m:s"] <= newest + 602
    assert sources == ["restored"]
    assert run(store.history("s")).source == "redis"  # put back: read from Redis again


def test_while_redis_cannot_be_read_the_replica_answers_with_its_copy_and_keeps_each_turn():
    redis, errors, sources, clock = FakeRedis(), [], [], Clock()
    store = SessionStore(
        redis,
        namespace="m",
        on_error=errors.append,
        on_replica=sources.append,
        clock=clock,
        sleep=clock.sleep,
    )
    assert ask(store, "s", 0)
    redis.down = True
    history = run(store.history("s"))
    assert (history.ok, history.source, contents(history)) == (True, "replica", ["q0", "a0"])
    assert ask(store, "s", 1)  # not in Redis, kept in the copy
    assert contents(run(store.history("s"))) == ["q0", "a0", "q1", "a1"]
    assert run(store.history("other")) == History(ok=False)  # a dialogue this replica never saw
    assert errors == ["read", "write", "read", "read"] and sources == ["replica", "replica"]
    redis.down = False  # back with what it had: the copy is newer, so it is put back
    history = run(store.history("s"))
    assert (history.source, contents(history)) == ("restored", ["q0", "a0", "q1", "a1"])
    assert len(redis.lists["chatfleet:session:m:s"]) == 2


def test_turns_answered_by_another_replica_since_the_copy_win():
    """The dialogue moved on to another replica: Redis is newer than this replica's copy and is read as is
    (the copy is never put back over it)."""
    redis = FakeRedis()
    here, there = SessionStore(redis, namespace="m"), SessionStore(redis, namespace="m")
    assert ask(here, "s", 0)
    assert run(there.history("s")).turns == 1
    assert ask(there, "s", 1)
    history = run(here.history("s"))
    assert (history.source, contents(history)) == ("redis", ["q0", "a0", "q1", "a1"])
    redis.lists.clear()  # a restart now: the copy here lacks what `there` answered
    assert contents(run(there.history("s"))) == ["q0", "a0", "q1", "a1"]


def test_the_copy_is_bounded_by_count_and_never_outlives_redis():
    now = [1_000.0]
    windows = Windows(ttl_s=60, limit=3, wall=lambda: now[0])

    def turn(at):
        return json.dumps({"messages": [], "reply": "a", "at": at})

    for i in range(5):
        windows.put(f"s{i}", [turn(now[0])])
    assert len(windows) == 3 and windows.get("s0") == () and windows.get("s4")  # least recently used went
    windows.get("s2")
    windows.put("old", [turn(now[0] - 61)])  # newest turn past the TTL: Redis would have dropped it
    assert windows.get("old") == () and len(windows) == 3
    now[0] += 61
    assert windows.get("s4") == ()
    windows.put("new", [turn(now[0])])
    assert len(windows) == 1  # the expired ones went with the next write
    assert windows.size == len(turn(now[0]))


def test_the_copy_is_bounded_in_characters():
    def turn(text):
        return json.dumps({"reply": text, "at": 1_000.0})

    windows = Windows(ttl_s=60, chars=3 * len(turn("x" * 10)), wall=lambda: 1_000.0)
    for i in range(3):
        windows.put(f"s{i}", [turn("x" * 10)])
    assert len(windows) == 3
    windows.put("big", [turn("x" * 10), turn("y" * 10)])  # two more turns' worth: the two oldest go
    assert (len(windows), windows.get("s0"), windows.get("s1")) == (2, (), ())
    windows.put("big", [turn("x" * 10)])  # replaced, not added
    assert windows.size == 2 * len(turn("x" * 10))


def test_a_replica_without_a_copy_reads_a_lost_history_as_lost():
    redis = FakeRedis()
    store = SessionStore(redis, namespace="m", local_dialogues=0)
    assert ask(store, "s", 0) and ask(store, "s", 1)
    redis.lists.clear()
    history = run(store.history("s"))
    assert (history.ok, history.source, history.turns) == (True, "redis", 0)


def test_replicas_with_partial_copies_put_a_dialogue_back_together(monkeypatch):
    """A dialogue spread over two replicas (a Service without affinity): each copy lacks the turns the
    other answered since. After a restart the first put-back is partial; the other replica's next read
    adds what it has, and no turn either of them kept is lost."""
    import itertools
    import time as real_time

    ticks = itertools.count(real_time.time(), 0.5)  # turns half a second apart, as real ones are
    monkeypatch.setattr(real_time, "time", lambda: next(ticks))
    redis = FakeRedis()
    a, b = SessionStore(redis, namespace="m", turns=10), SessionStore(redis, namespace="m", turns=10)
    for i, store in enumerate([a, b, a, b]):
        run(store.history("s"))
        assert ask(store, "s", i)
    redis.lists.clear()
    history = run(a.history("s"))  # a's copy: turns 0-2
    assert (history.source, history.turns) == ("restored", 3)
    assert ask(a, "s", 4)
    history = run(b.history("s"))  # b's copy has turn 3, which a's lacked
    assert (history.source, contents(history)[-4:]) == ("restored", ["q3", "a3", "q4", "a4"])
    assert [json.loads(t)["reply"] for t in redis.lists["chatfleet:session:m:s"]] == [
        f"a{i}" for i in range(5)
    ]
    assert run(a.history("s")).source == "redis"  # whole again: nothing more to put back


def test_a_window_whose_turns_are_out_of_time_order_is_never_rewritten():
    """Turns of replicas whose clocks differ sit in Redis out of time order: with nothing missing from
    Redis, the read keeps Redis's window as it is (no put-back, no write on every read)."""
    redis = FakeRedis()
    store = SessionStore(redis, namespace="m")
    key = "chatfleet:session:m:s"
    late, early = (
        json.dumps({"messages": [], "reply": r, "at": at}) for r, at in (("a0", 1e10), ("a1", 1e10 - 5))
    )
    redis.lists[key] = [late, early]
    assert run(store.history("s")).source == "redis"
    redis.pipeline = None  # any write would fail here
    history = run(store.history("s"))
    assert (history.source, [m["content"] for m in history.messages]) == ("redis", ["a0", "a1"])
