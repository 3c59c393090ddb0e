"""The stream relay the operator runs (spec.streamRelay) on real pods: a replica killed mid-answer, every
stream completes.

Test design: a bot of two pods on the real node with `streamRelay.enabled`; the operator writes Service
`bot-replicas`, then Deployment and Service `bot-relay` (the relay's one upstream: that Service's ClusterIP,
through kube-proxy). Twelve users stream an answer each through Service `bot-relay` (kube-proxy spreads
the relay's connections over both pods). Once every stream has its first chunk, the chat-api container of
one pod is SIGKILLed from the host, its PID found beforehand so the kill comes at once (a crash; the
kubelet restarts it, the pod keeps its address, its port refuses until then). Every stream must end with [DONE] and no error event; the relay must have resumed at least
one (its own counter, read from its pod): the kill did cut streams, and none reached its user cut. An
attempt whose victim finished its streams before the kill (nothing to resume) is tried again, up to 3 times.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
from typing import Any

import pytest
from chatfleet_platform.load.realpods import (
    container_pid,
    metric_sum,
    on_real_node,
    pod_ready,
    pods_matching,
    service_url,
)
from chatfleet_platform.load.releasetraffic import Bot
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

USERS = 12
MAX_TOKENS = 256


def pods(bot: Bot, selector: str) -> list[dict[str, Any]]:
    return pods_matching(bot.cluster, bot.ns, selector)


class Stream(threading.Thread):
    """One user's streamed answer through the relay: what arrived, and how it ended."""

    def __init__(self, url: str, n: int) -> None:
        super().__init__(daemon=True)
        self.url, self.n = url, n
        self.first = threading.Event()
        self.status, self.chunks, self.done, self.errors = 0, 0, False, []

    def run(self) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {
            "messages": [{"role": "user", "content": f"User {self.n}: tell me a long story."}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
        }
        try:
            conn.request(
                "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            self.status = resp.status
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    self.done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.errors.append(event["error"].get("code"))
                    self.chunks += 1
                    self.first.set()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.errors.append(type(exc).__name__)
        finally:
            self.first.set()
            conn.close()


@pytest.mark.timeout(900)
def test_a_replica_killed_mid_answer_every_stream_through_the_relay_completes(
    cluster, real_operator, real_ns, runtime_image, host_model_dir
):
    bot = Bot(cluster, real_ns)
    spec = on_real_node(
        {
            "model": {"hostPath": "/", "maxContextTokens": 512},
            "runtime": {"maxNewTokens": 64, "streaming": True},
        },
        image=runtime_image,
        model_dir=host_model_dir,
    )
    spec["scaling"]["replicas"] = 2
    spec["runtime"]["maxNewTokens"] = (
        MAX_TOKENS  # longer answers than on_real_node's cap: the kill lands mid-stream
    )
    spec["streamRelay"] = {"enabled": True, "replicas": 1}
    bot.apply(spec)
    bot.wait(bot.ready, 600, "bot Ready")
    fleet, relays = "chatfleet.io/service=bot", "app.kubernetes.io/component=stream-relay"

    bot.wait(lambda: len([p for p in pods(bot, fleet) if pod_ready(p)]) == 2, 600, "two Ready replicas")
    bot.wait(lambda: [p for p in pods(bot, relays) if pod_ready(p)], 300, "the relay Ready")
    (relay_pod,) = pods(bot, relays)
    relay_metrics = f"http://{relay_pod['status']['podIP']}:9400/metrics"
    url = service_url(cluster, real_ns, "bot-relay")
    attempts = []
    for attempt in range(3):
        live = sorted((p for p in pods(bot, fleet) if pod_ready(p)), key=lambda p: p["metadata"]["name"])
        victim = live[attempt % len(live)]
        pid = container_pid(cluster, victim, "chat-api")  # found before the streams: the kill comes at once
        before = metric_sum(relay_metrics, "chatfleet_relay_resumes_total")
        streams = [Stream(url, n) for n in range(USERS)]
        for s in streams:
            s.start()
        assert all(s.first.wait(120) for s in streams), [s.errors for s in streams]
        os.kill(pid, signal.SIGKILL)
        for s in streams:
            s.join(180)
        resumed = metric_sum(relay_metrics, "chatfleet_relay_resumes_total") - before
        outcome = {
            "victim": victim["metadata"]["name"],
            "resumed": resumed,
            "streams": [(s.status, s.done, s.chunks, s.errors) for s in streams],
        }
        attempts.append(outcome)
        print(f"relay on real pods: {outcome}")
        assert all(s.status == 200 and s.done and not s.errors for s in streams), attempts
        if resumed >= 1:
            break
        # the victim's streams had finished before the kill: wait for it to be back, then again
        wait_until(lambda: len([p for p in pods(bot, fleet) if pod_ready(p)]) == 2, 300, 0.5)
    assert attempts[-1]["resumed"] >= 1, f"no attempt cut a stream for the relay to resume: {attempts}"
