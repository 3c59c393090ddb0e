"""The Redis drill on real pods: the session store killed mid-dialogue and started again; answers keep coming.

Test design: a bot of one pod on the real node keeps its sessions in the session's Redis for pods (a real
redis-server on the node's bridge address, without persistence, as a cache-only Redis is). Users hold
five-turn streamed dialogues through the Service. Once they are under way, the Redis process is killed
with SIGKILL (no shutdown, no save), stays down 8 s, and is started again on the same port.

What users must see, turn by turn (`DialogueLoad`):
- every turn answered: no cut stream, no non-2xx, no failed request -- the outage costs the history, never
  the answer;
- the history's state said plainly: each turn that began while Redis was down says `chatfleet.history:
  "unavailable"`; each turn that began once it was back (2 s settle) says `"ok"`;
- nothing lost for the dialogues that began after the restart. Dialogues that spanned it lost what the
  old process held (a Redis without persistence forgets everything): their later turns load fewer turns
  than they had, and that is counted, not hidden (`lost` in the summary printed).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES
from chatfleet_platform.common import procs
from chatfleet_platform.load.dialogues import DialogueLoad
from chatfleet_platform.load.realpods import service_url
from chatfleet_platform.load.releasetraffic import Bot, traffic_spec
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]

DOWN_SECONDS = 8.0
SETTLE_SECONDS = 2.0


@pytest.mark.timeout(900)
def test_answers_keep_coming_while_redis_is_killed_and_started_again(
    cluster, real_operator, real_ns, pod_prometheus, pod_redis, runtime_image, host_model_dir
):
    bot = Bot(cluster, real_ns)
    pod_redis.secret(real_ns)
    bot.apply(traffic_spec(pod_prometheus.url, image=runtime_image, model_dir=host_model_dir))
    bot.wait(bot.ready, 600, "bot Ready")
    url = service_url(cluster, real_ns, bot.name)
    load = DialogueLoad(url, concurrency=4, pin=False, sources=CLIENT_ADDRESSES, max_seconds=300).start()
    server = pod_redis.server
    try:
        bot.wait(lambda: load.summary()["ok"] >= 10, 180, "dialogues under way")
        t_kill = time.monotonic()
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        assert wait_until(lambda: not procs.port_in_use(server.port), 10, 0.1), "Redis still listening"
        time.sleep(DOWN_SECONDS)
        server.start()  # the same port: the pods' Secret still names it
        t_back = time.monotonic()
        settled = t_back + SETTLE_SECONDS
        bot.wait(
            lambda: sum(r.dialogue_started >= settled for r in load.results) >= 12, 180, "dialogues after"
        )
    finally:
        summary = load.stop()
    during = [r for r in load.results if t_kill + 0.5 <= r.at < t_back - 0.5]
    after = [r for r in load.results if r.at >= t_back + SETTLE_SECONDS]
    fresh = [r for r in load.results if r.dialogue_started >= t_back + SETTLE_SECONDS]
    summary["history_during"] = sorted({r.history for r in during})
    summary["history_after"] = sorted({r.history for r in after})
    summary["lost_in_fresh_dialogues"] = sum(r.lost for r in fresh)
    print(f"redis drill summary: {summary}")

    assert (summary["cut"], summary["non_2xx"], summary["failed"]) == (0, 0, 0), summary
    assert during and {r.history for r in during} == {"unavailable"}, summary
    assert after and {r.history for r in after} == {"ok"}, summary
    assert fresh and summary["lost_in_fresh_dialogues"] == 0, summary
