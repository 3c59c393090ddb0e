"""Zero-drop releases on real pods: no stream cut, no non-2xx answer, no lost history, no switched dialogue.

Test design: a bot on the real node keeps its sessions in a real Redis. Users hold five-turn streamed
dialogues from background threads (`DialogueLoad`), each turn checking that the stream ended with
[DONE], that the status was 200 and that the history the answer reports holds every turn saved before.
While they chat, the scenario (`chatfleet_platform.load.releasetraffic`) promotes a new revision, rolls one
back with `spec.rollout.abort`, and scales a replica down: each takes pods away, and each pod must drain.

- Through the Service (replica ratio, no Gateway API in the cluster): kube-proxy's ClientIP affinity;
  users come from the real node's client addresses.
- Through the gateway (Traefik serving the operator's HTTPRoute), with sticky dialogues: users echo
  `x-chatfleet-revision`, and no dialogue that ended before the rollback began may have changed
  revision -- the promotion included, which drains the old revision's dialogues before it re-templates
  stable. (The rollback moves the canary's dialogues to stable on purpose: those are not counted.)

Counts are small here (make test); `make bench-release-traffic` runs the issue's full counts.
"""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime

import pytest
from chatfleet_platform.addons.gateway import server_errors
from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES
from chatfleet_platform.load.dialogues import DialogueLoad
from chatfleet_platform.load.realpods import serves, service_url
from chatfleet_platform.load.releasetraffic import Bot, Scenario, traffic_spec

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

USERS = 6


def run_scenario(bot: Bot, load: DialogueLoad) -> tuple[dict, float]:
    """Promote, roll back, scale down under the load; (summary, when the rollback began)."""
    scenario = Scenario(bot)
    try:
        bot.wait(lambda: load.summary()["ok"] >= 10, 180, "dialogues under way")
        scenario.promote()
        t_rollback = time.monotonic()
        scenario.roll_back()
        scenario.scale_down()
        time.sleep(5)
    finally:
        summary = load.stop()
    summary["operations"] = scenario.log
    summary["bad_turns_during"] = {name: load.failures_between(a, b) for name, a, b in scenario.spans}
    # wall-clock times, to read beside the events and the components' logs
    summary["spans"] = [f"{name} {clock(a)}-{clock(b)}" for name, a, b in scenario.spans]
    summary["bad_turns"] = [f"{clock(r.at)} {r.outcome} {r.error}" for r in load.bad_turns()[:60]]
    print(f"zero-drop summary: {summary}")
    return summary, t_rollback


def clock(monotonic: float) -> str:
    """A time.monotonic() reading as the wall clock's HH:MM:SS.mmm (UTC, as the events' times)."""
    wall = time.time() - (time.monotonic() - monotonic)
    return datetime.fromtimestamp(wall, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


def assert_nothing_dropped(bot: Bot, summary: dict) -> None:
    """Nothing cut, refused, unanswered or forgotten; a failure names the bad turns (wall clock) and what
    the namespace's pods, endpoints and events were doing."""
    bad = summary["cut"] + summary["non_2xx"] + summary["failed"] + summary["lost_history"]
    context = f"{summary}\n{bot.snapshot(events=200)}" if bad else str(summary)
    assert summary["dialogues"] >= USERS, context
    assert summary["cut"] == 0, f"streams cut: {context}"
    assert summary["non_2xx"] == 0, f"non-2xx answers: {context}"
    assert summary["failed"] == 0, f"turns without an answer: {context}"
    assert summary["lost_history"] == 0, f"lost histories: {context}"


@pytest.mark.timeout(1500)
def test_releases_drop_nothing_through_the_service(
    cluster, real_operator, real_ns, pod_prometheus, pod_redis, runtime_image, host_model_dir
):
    bot = Bot(cluster, real_ns)
    pod_redis.secret(real_ns)
    bot.apply(traffic_spec(pod_prometheus.url, image=runtime_image, model_dir=host_model_dir))
    bot.wait(bot.ready, 600, "bot Ready")
    url = service_url(cluster, real_ns, bot.name)
    load = DialogueLoad(url, concurrency=USERS, pin=False, sources=CLIENT_ADDRESSES, max_seconds=1200).start()
    summary, _ = run_scenario(bot, load)
    assert_nothing_dropped(bot, summary)


@pytest.mark.timeout(1500)
def test_releases_drop_nothing_and_keep_dialogues_on_their_revision_through_the_gateway(
    cluster,
    real_operator,
    real_ns,
    pod_prometheus,
    pod_redis,
    gateway,
    runtime_image,
    host_model_dir,
    tmp_path,
):
    bot = Bot(cluster, real_ns)
    pod_redis.secret(real_ns)
    bot.apply(traffic_spec(pod_prometheus.url, image=runtime_image, model_dir=host_model_dir))
    bot.wait(bot.ready, 600, "bot Ready")
    bot.wait(lambda: serves(gateway.url), 60, "the gateway serving the route")
    t0 = time.monotonic()
    load = DialogueLoad(gateway.url, concurrency=USERS, pin=True, max_seconds=1200).start()
    summary, t_rollback = run_scenario(bot, load)
    summary["gateway_5xx"] = server_errors(gateway.access_log)
    if gateway.access_log.exists():  # kept with the test's files: when each 5xx happened, and from where
        shutil.copy(gateway.access_log, tmp_path / "traefik-access.log")
    assert_nothing_dropped(bot, summary)
    before_rollback, switched = load.switched_between(t0, t_rollback)
    assert before_rollback >= USERS, summary
    assert switched == 0, f"{switched} of {before_rollback} dialogues changed revision through the promotion"
    assert len(summary["revisions"]) >= 2, f"the promotion was never served: {summary['revisions']}"
