"""`make bench-chaos-pods` (run on its own, not by `make bench-chaos`): replicas killed mid-answer and the
session store restarted on real pods, through the stream relay the operator runs beside the same users
straight through the fleet's Service.

Everything is real: the local Kubernetes, a real node (kubelet, containerd, runc) running the project's
runtime image (Triton + the chat API on the tiny model, on CPU), Redis for the sessions, the operator (a
host process), and the ChatbotService's own stream relay (`spec.streamRelay`: its Deployment and Service
`<name>-relay`, the operator's). One ChatbotService of REPLICAS (3) pods; USERS (32) users hold
five-turn streamed dialogues (`DialogueLoad`, MAX_TOKENS tokens per answer, the end-of-sequence token
suppressed by the runtime's cap, so answers are long enough to be cut).

While they chat, every INTERVAL seconds one fault, KILLS (10) kills and REDIS_RESTARTS (2) Redis restarts
spread among them:
- a kill (once at least two replicas are Ready): the chat-api container of the Ready replica killed least
  so far is SIGKILLed from the host: a crash (an OOM kill, a segfault); the kubelet restarts the container in its
  pod (its restart back-off growing with each kill);
- a Redis restart: the session store is SIGKILLed (no shutdown, no save), stays down REDIS_DOWN (8) s and
  is started again on the same port. It keeps nothing (no persistence, as a cache-only Redis). The
  replicas put back the windows they kept (`chatfleet.history: "restored"`) and answer from them while it
  is down (`"replica"`); what they could not (a dialogue's turns only a killed replica had, or a first
  turn while it is down: `"unavailable"`, counted) shows as lost histories of the dialogues that spanned
  it, counted apart from the other lost histories.

Rows, on the same pods, the baseline first (the relay's row meets the longer restart back-offs):
- `service` (the baseline: what a user gets without the relay, the fleet's Service and kube-proxy): the
  streams a kill cuts reach their users cut;
- `relay` (Chatfleet: Service `<name>-relay`): a cut stream is continued on another replica from the
  session's history and the text already sent.

Figures per row: turns asked, completed, cut, non-2xx, no answer, lost histories, turns answered without
a history, the kills and Redis restarts, the relay's resumes (its own counter) and the silence they cost
the clients (the relay's own measure, `chatfleet_relay_resume_gap_seconds`: from the last chunk before
the cut to the first text after it; mean, and how many within 2 s). Writes
bench-results/chaos-pods.json and prints the table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(REPO / "bench"))

from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES  # noqa: E402
from chatfleet_platform.load.dialogues import DialogueLoad  # noqa: E402
from chatfleet_platform.load.realpods import (  # noqa: E402
    kill_container_process,
    metric_sum,
    pod_ready,
    pods_matching,
    service_url,
)
from chatfleet_platform.load.releasetraffic import Bot  # noqa: E402
from chatfleet_platform.localruntime.testing import metric_value  # noqa: E402
from release_traffic_bench import Platform, table  # noqa: E402

REPLICAS = int(os.environ.get("REPLICAS", "3"))
USERS = int(os.environ.get("USERS", "32"))
KILLS = int(os.environ.get("KILLS", "10"))
REDIS_RESTARTS = int(os.environ.get("REDIS_RESTARTS", "2"))
REDIS_DOWN = 8.0
#: Seconds after Redis is back within which a new dialogue may still meet the restart's effects.
SETTLE_SECONDS = 2.0
INTERVAL = float(os.environ.get("INTERVAL", "10"))
MAX_TOKENS = 96
#: Smaller CPU requests than the real node's usual 250m, so that the replicas and the relay fit its cores.
RESOURCES = {"cpu": "100m", "memory": "2Gi"}
RELAY = "app.kubernetes.io/component=stream-relay"
OUT = REPO / "bench-results" / "chaos-pods.json"


def say(msg: str) -> None:
    """Progress line."""
    print(f"[bench-chaos-pods] {msg}", flush=True)


def pods(bot: Bot, selector: str) -> list[dict[str, Any]]:
    return pods_matching(bot.cluster, bot.ns, selector)


def replicas_ready(bot: Bot) -> list[dict[str, Any]]:
    return [p for p in pods(bot, f"chatfleet.io/service={bot.name}") if pod_ready(p)]


def two_ready(bot: Bot) -> list[dict[str, Any]] | None:
    """The Ready replicas when at least two are (one to kill, one for the relay to resume on)."""
    live = replicas_ready(bot)
    return live if len(live) >= 2 else None


def relay_metrics(bot: Bot) -> list[str]:
    """The /metrics URLs of the relay pods."""
    return [f"http://{pod['status']['podIP']}:9400/metrics" for pod in pods(bot, RELAY)]


def relay_resumes(bot: Bot) -> float:
    """The relay pods' resumes so far (their own counter, summed)."""
    return sum(metric_sum(url, "chatfleet_relay_resumes_total") for url in relay_metrics(bot))


def relay_gaps(bot: Bot) -> dict[str, float]:
    """The relay pods' measure of the silence their resumes cost the clients so far (summed): count, sum
    (seconds), and how many within 2 s (its histogram's le="2.0" bucket)."""
    urls = relay_metrics(bot)
    name = "chatfleet_relay_resume_gap_seconds"
    return {
        key: sum(metric_value(url, f"{name}_{key}", **labels) for url in urls)
        for key, labels in (("count", {}), ("sum", {}), ("bucket", {"le": "2.0"}))
    }


def faults() -> list[str]:
    """The row's faults in order: KILLS "kill"s with REDIS_RESTARTS "redis" spread evenly among them."""
    plan = ["kill"] * KILLS
    for i in range(REDIS_RESTARTS, 0, -1):
        plan.insert(i * KILLS // (REDIS_RESTARTS + 1), "redis")
    return plan


def restart_redis(platform: Platform) -> tuple[float, float]:
    """SIGKILL the session store, leave it down REDIS_DOWN seconds, start it again on the same port;
    (killed, back), monotonic."""
    assert platform.redis is not None
    down = time.monotonic()
    platform.redis.kill()
    time.sleep(REDIS_DOWN)
    platform.redis.start()
    return down, time.monotonic()


def lost_to_redis(results: list[Any], outages: list[tuple[float, float]]) -> int:
    """Turns with a lost history whose dialogue spanned a Redis restart: begun before Redis was back (and
    SETTLE_SECONDS more), the turn asked after it was killed. The store kept nothing, so these lost what
    it held; any other lost history is a fault of the fleet, not of the store."""
    return sum(
        1
        for r in results
        if r.lost
        and any(r.dialogue_started < back + SETTLE_SECONDS and r.at >= down for down, back in outages)
    )


def row(platform: Platform, bot: Bot, via: str) -> dict[str, Any]:
    """One row: the users through `via` (Service `bot` or `bot-relay`), the faults, what they saw."""
    service = f"{bot.name}-relay" if via == "relay" else bot.name
    load = DialogueLoad(
        service_url(platform.cluster, bot.ns, service),
        concurrency=USERS,
        pin=False,
        sources=CLIENT_ADDRESSES,
        max_seconds=3600,
        think_seconds=(0.5, 1.5),
        max_tokens=MAX_TOKENS,
        timeout=120,
    ).start()
    log: list[dict[str, Any]] = []
    outages: list[tuple[float, float]] = []
    try:
        bot.wait(lambda: load.summary()["ok"] >= 20, 300, "dialogues under way")
        before, gaps_before = relay_resumes(bot), relay_gaps(bot)
        t0 = time.monotonic()
        for n, fault in enumerate(faults(), 1):
            time.sleep(INTERVAL)
            if fault == "redis":
                outages.append(restart_redis(platform))
                log.append({"at_s": round(outages[-1][0] - t0, 1), "fault": "redis", "down_s": REDIS_DOWN})
                say(f"{via}: fault {n}: Redis killed, down {REDIS_DOWN:.0f} s, started again")
                continue
            live = bot.wait(lambda: two_ready(bot), 600, "two Ready replicas")
            # the Ready replica killed least so far (the log says): the kills spread over the replicas
            killed = Counter(f["pod"] for f in log if f["fault"] == "kill")
            victim = min(live, key=lambda p: (killed[p["metadata"]["name"]], p["metadata"]["name"]))
            pid = kill_container_process(platform.cluster, victim, "chat-api")
            log.append(
                {
                    "at_s": round(time.monotonic() - t0, 1),
                    "fault": "kill",
                    "pod": victim["metadata"]["name"],
                    "pid": pid,
                }
            )
            say(f"{via}: fault {n}: chat-api of {victim['metadata']['name']} killed")
        time.sleep(INTERVAL)
    finally:
        summary = load.stop()
    resumes = relay_resumes(bot) - before if via == "relay" else 0.0
    gaps = {k: v - gaps_before[k] for k, v in relay_gaps(bot).items()} if via == "relay" else {}
    unavailable = sum(r.history == "unavailable" for r in load.results)
    from_copy = Counter(r.history for r in load.results if r.history in ("restored", "replica"))
    spanned = lost_to_redis(load.results, outages)
    out = {
        "row": "relay (Chatfleet)" if via == "relay" else "service (baseline)",
        "via": service,
        **{k: summary[k] for k in ("turns", "ok", "dialogues", "cut", "non_2xx", "failed", "lost_history")},
        "history_unavailable": unavailable,
        "history_restored": from_copy["restored"],
        "history_from_replica": from_copy["replica"],
        "lost_history_redis": spanned,
        "lost_history_other": summary["lost_history"] - spanned,
        "kills": sum(f["fault"] == "kill" for f in log),
        "redis_restarts": sum(f["fault"] == "redis" for f in log),
        "resumes": resumes,
        "resume_gap_mean_s": round(gaps["sum"] / gaps["count"], 3) if gaps.get("count") else None,
        "resume_gaps_within_2s": f"{int(gaps['bucket'])}/{int(gaps['count'])}" if gaps else None,
        "codes": summary["codes"],
        "errors": summary["errors"],
        "lost": summary["lost"],
        "fault_log": log,
    }
    say(f"{via}: { ({k: v for k, v in out.items() if k not in ('fault_log', 'errors', 'lost')}) }")
    return out


def main() -> int:
    """Both rows on one platform and the same bot; print the table and write the JSON."""
    platform = Platform()
    results: dict[str, Any] = {
        "replicas": REPLICAS,
        "users": USERS,
        "kills_per_row": KILLS,
        "redis_restarts_per_row": REDIS_RESTARTS,
        "redis_down_s": REDIS_DOWN,
        "interval_s": INTERVAL,
        "max_tokens": MAX_TOKENS,
        "rows": [],
    }
    try:
        platform.up()
        bot = platform.bot(
            resources=RESOURCES,
            wait=False,
            over={  # on_real_node sets one replica: the scaling section is ours here
                "scaling": {"replicas": REPLICAS},
                "runtime": {"maxNewTokens": MAX_TOKENS},
                "streamRelay": {"enabled": True, "replicas": 1},
            },
        )
        bot.wait(bot.ready, 900, "bot Ready")
        bot.wait(lambda: len(replicas_ready(bot)) == REPLICAS, 600, f"{REPLICAS} Ready replicas")
        bot.wait(lambda: [p for p in pods(bot, RELAY) if pod_ready(p)], 300, "the relay Ready")
        say(f"{REPLICAS} replicas and the relay Ready")
        for via in ("service", "relay"):
            results["rows"].append(row(platform, bot, via))
    finally:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(results, indent=1, default=str))
        platform.down()
    print()
    print(
        f"{REPLICAS} replicas on real pods, {USERS} users streaming {MAX_TOKENS}-token answers; a row: {KILLS}"
        f" chat-api kills, {REDIS_RESTARTS} Redis restarts ({REDIS_DOWN:.0f} s down, nothing kept)"
    )
    print(
        table(
            results["rows"],
            [
                ("row", "row"),
                ("kills", "chat-api kills"),
                ("redis_restarts", "Redis restarts"),
                ("turns", "turns"),
                ("cut", "streams cut"),
                ("non_2xx", "non-2xx"),
                ("failed", "no answer"),
                ("history_unavailable", "answered without history"),
                ("history_restored", "history put back from a replica's copy"),
                ("history_from_replica", "answered from a replica's copy (Redis down)"),
                ("lost_history_redis", "lost histories: dialogues across a Redis restart"),
                ("lost_history_other", "lost histories: others"),
                ("resumes", "relay resumes"),
                ("resume_gap_mean_s", "resume silence, mean s (the relay's measure)"),
                ("resume_gaps_within_2s", "resumes within 2 s"),
            ],
        )
    )
    print(f"\nwritten: {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
