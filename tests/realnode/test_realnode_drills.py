"""Drills on real pods: the session store killed and started again, and a 5x burst; answers keep coming.

Test design: one bot of one pod on the real node (module-scoped) keeps its sessions in the session's Redis
for pods (a real redis-server on the node's bridge address, without persistence, as a cache-only Redis is).
Its engine runs at most 2 requests at once and queues 4 more for at most 2 s (`dynamicBatching.maxBatchSize`,
`kvCache.admissionQueue`, `kvCache.admissionWaitMilliseconds`), so a burst overflows it on the CPU. Users
hold five-turn streamed dialogues through the Service (`DialogueLoad`).

- Redis: once dialogues are under way, the Redis process is killed with SIGKILL (no shutdown, no save),
  stays down 8 s, and is started again on the same port, empty (a Redis without persistence forgets
  everything). Every turn must be answered (no cut stream, no non-2xx, no failed request), and no
  dialogue may lose history, those that spanned the restart included: the pod keeps its own copy of the
  windows it answered. The history's state is said plainly: each turn that began while Redis was down
  says `chatfleet.history: "replica"` (the pod's copy) or, for a dialogue's first turn, `"unavailable"`;
  each that began once it was back (2 s settle) says `"restored"` (the copy put back) or `"ok"`, and
  the dialogues that spanned it were put back (`"restored"`) from their first turn after it. Those first
  turns are counted from when Redis was asked to start, not from when its start was seen: turns take
  a fraction of a second, so every one that put a copy back could come before the port was polled up.
- Burst: 2 users, then 8 more within a second (5x) for 10 s, then 2 again. What the engine cannot hold is
  refused as documented: HTTP 429 with `Retry-After: 1` (code `overloaded`, "kv budget: ..."), never a 5xx, a cut stream, a
  refused connection, or a fallback answer (429s are not breaker failures, so the breaker stays closed);
  once the burst is over, every turn is answered again.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES
from chatfleet_platform.load.dialogues import DialogueLoad
from chatfleet_platform.load.realpods import service_url
from chatfleet_platform.load.releasetraffic import Bot, traffic_spec
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

DOWN_SECONDS = 8.0
SETTLE_SECONDS = 2.0
BASE_USERS, BURST_USERS, BURST_SECONDS = 2, 8, 10.0


@pytest.fixture(scope="module")
def drill_bot(
    cluster, real_node, reaper, real_operator, pod_prometheus, pod_redis, runtime_image, host_model_dir
) -> Iterator[tuple[Bot, str]]:
    """The drills' bot (one pod, sessions in the pod Redis, a small engine queue), Ready; (bot, its URL)."""
    ns = f"real-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    try:
        assert wait_until(
            lambda: cluster.kubectl("get", "sa", "default", namespace=ns, check=False).returncode == 0, 30
        )
        pod_redis.secret(ns)
        spec = traffic_spec(pod_prometheus.url, image=runtime_image, model_dir=host_model_dir)
        spec["runtime"]["dynamicBatching"] = {"maxBatchSize": 2}
        spec["runtime"]["kvCache"] = {"admissionQueue": 4, "admissionWaitMilliseconds": 2000}
        bot = Bot(cluster, ns)
        bot.apply(spec)
        bot.wait(bot.ready, 600, "bot Ready")
        yield bot, service_url(cluster, ns, bot.name)
    finally:
        reaper.delete(ns)


@pytest.mark.timeout(600)
def test_answers_keep_coming_while_redis_is_killed_and_started_again(drill_bot, pod_redis):
    bot, url = drill_bot
    load = DialogueLoad(url, concurrency=4, pin=False, sources=CLIENT_ADDRESSES, max_seconds=300).start()
    server = pod_redis.server
    try:
        bot.wait(lambda: load.summary()["ok"] >= 10, 180, "dialogues under way")
        t_kill = time.monotonic()
        server.kill()
        time.sleep(DOWN_SECONDS)
        t_restart = time.monotonic()  # turns are short: the first ones back may come before start() returns
        server.start()  # the same port: the pods' Secret still names it
        t_back = time.monotonic()
        settled = t_back + SETTLE_SECONDS
        bot.wait(
            lambda: sum(r.dialogue_started >= settled for r in load.results) >= 12, 180, "dialogues after"
        )
    finally:
        summary = load.stop()
    during = [r for r in load.results if t_kill + 0.5 <= r.at < t_restart - 0.5]
    after = [r for r in load.results if r.at >= t_back + SETTLE_SECONDS]
    fresh = [r for r in load.results if r.dialogue_started >= t_back + SETTLE_SECONDS]
    summary["history_during"] = dict(Counter(r.history for r in during))
    summary["history_after"] = dict(Counter(r.history for r in after))
    summary["history_once_back"] = dict(Counter(r.history for r in load.results if r.at >= t_restart))
    summary["lost_in_fresh_dialogues"] = sum(r.lost for r in fresh)
    print(f"redis drill summary: {summary}")

    assert (summary["cut"], summary["non_2xx"], summary["failed"]) == (0, 0, 0), summary
    assert during and "replica" in summary["history_during"], summary
    assert set(summary["history_during"]) <= {"replica", "unavailable"}, summary
    assert "restored" in summary["history_once_back"], summary  # the first turns back may fall in the settle
    assert set(summary["history_after"]) <= {"ok", "restored"}, summary
    assert summary["lost_history"] == 0, summary  # the dialogues across the restart included
    assert fresh and summary["lost_in_fresh_dialogues"] == 0, summary


@pytest.mark.timeout(600)
def test_a_5x_burst_is_refused_as_documented_never_with_a_5xx(drill_bot):
    bot, url = drill_bot
    base = DialogueLoad(
        url, concurrency=BASE_USERS, pin=False, sources=CLIENT_ADDRESSES[:100], max_seconds=300
    )
    burst = DialogueLoad(url, concurrency=BURST_USERS, pin=False, sources=CLIENT_ADDRESSES[100:], seed=11)
    base.start()
    try:
        bot.wait(lambda: base.summary()["ok"] >= 6, 120, "the base load under way")
        t_burst = time.monotonic()
        burst.start()  # 2 -> 10 users within a second
        time.sleep(BURST_SECONDS)
        burst.stop()
        t_over = time.monotonic()
        bot.wait(lambda: sum(r.at >= t_over + SETTLE_SECONDS for r in base.results) >= 8, 120, "turns after")
    finally:
        burst.stop()
        base_summary = base.stop()
    turns = base.results + burst.results
    refused = [r for r in turns if r.outcome != "ok"]
    during = [r for r in turns if t_burst <= r.at < t_over]
    after = [r for r in base.results if r.at >= t_over + SETTLE_SECONDS]
    figures = {
        "turns_during_burst": len(during),
        "answered_during_burst": sum(r.outcome == "ok" for r in during),
        "refused": dict(Counter(r.outcome for r in refused)),
        "refusals": sorted({r.error for r in refused})[:5],
        "fallbacks": dict(Counter(r.fallback for r in turns if r.fallback)),
        "after": dict(Counter(r.outcome for r in after)),
        "base": base_summary,
    }
    print(f"burst drill: {figures}")
    assert {r.outcome for r in refused} <= {"http-429"}, figures
    assert all("retry-after=1" in r.error and "kv budget" in r.error for r in refused), figures
    assert not figures["fallbacks"], figures
    assert after and {r.outcome for r in after} == {"ok"}, figures
