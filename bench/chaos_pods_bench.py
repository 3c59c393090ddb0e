"""`make bench-chaos-pods` (run on its own, not by `make bench-chaos`): replicas killed mid-answer, GPU nodes
lost and the session store restarted on real pods, through the stream relay the operator runs beside the
same users straight through the fleet's Service.

Everything is real: the local Kubernetes, two real nodes (kubelet, containerd, runc; GPUS_PER_NODE fake
GPUs each) running the project's runtime image (Triton + the chat API on the tiny model, on CPU), Redis
for the sessions, the operator (a host process), and the ChatbotService's own stream relay
(`spec.streamRelay`: its Deployment and Service `<name>-relay`, the operator's). One ChatbotService of
REPLICAS (3) pods of one GPU each (four GPUs in all: the scheduler spreads them over both nodes, and a
lost node's pods mostly wait for a node with a free GPU); USERS (32) users hold five-turn streamed
dialogues (`DialogueLoad`, MAX_TOKENS tokens per answer, the end-of-sequence token suppressed by the
runtime's cap, so answers are long enough to be cut).

While they chat, every INTERVAL seconds one fault, KILLS (10) kills, NODE_LOSSES (2) node losses and
REDIS_RESTARTS (2) Redis restarts spread among them:
- a kill (once at least two replicas are Ready): the chat-api container of the Ready replica killed least
  so far is SIGKILLed from the host: a crash (an OOM kill, a segfault); the kubelet restarts the container in its
  pod (its restart back-off growing with each kill);
- a node loss (once Ready replicas run on both nodes): the node that holds one or more Ready replicas and
  not the relay loses power (`RealNodes.lose_power`): its kubelet is killed and its pods frozen NODE_SILENT
  (5) s, longer than the relay's stall limit (STALL_SECONDS, 1 s), so they send nothing and close nothing,
  as a machine without power; then they are killed and its Node deleted, as a cloud's node controller does.
  Their pods are deleted at once (the pod garbage collector's part, after its quarantine, brought forward
  so the loss fits the row). NODE_DOWN (10) s later the node rejoins (a replacement machine of the same name: a new
  kubelet, its GPUs advertised again); the fleet's new pods start on the surviving node's free GPU and on
  the rejoined node;
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
the cut to the first text after it; mean, and how many within 2 s), the relay's dialogue turns by where
they went (`chatfleet_relay_dialogue_turns_total`: kept on the dialogue's replica, moved, new), and per
Redis outage how the turns met it (`redis_outage_turns`). Writes bench-results/chaos-pods.json and prints
the table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from itertools import zip_longest
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
NODE_LOSSES = int(os.environ.get("NODE_LOSSES", "2"))
REDIS_RESTARTS = int(os.environ.get("REDIS_RESTARTS", "2"))
NODES = 2
GPUS_PER_NODE = 2
NODE_SILENT = 5.0
#: The relay's stall limit (spec.streamRelay.stallSeconds, 3 by default): the least the CRD admits, since a
#: resume after a silent node costs this much silence plus the next replica's first token (the replicas'
#: heartbeats come every quarter of it, so only a silent replica reaches it).
STALL_SECONDS = 1
NODE_DOWN = 10.0
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


def summed(urls: list[str], name: str, **labels: str) -> float:
    """A metric's samples matching `labels` on every /metrics page of `urls`, summed."""
    return sum(metric_value(url, name, **labels) for url in urls)


def relay_gaps(bot: Bot) -> dict[str, float]:
    """The relay pods' measure of the silence their resumes cost the clients so far (summed): count, sum
    (seconds), and how many within 2 s (its histogram's le="2.0" bucket)."""
    urls, name = relay_metrics(bot), "chatfleet_relay_resume_gap_seconds"
    return {
        "count": summed(urls, f"{name}_count"),
        "sum": summed(urls, f"{name}_sum"),
        "bucket": summed(urls, f"{name}_bucket", le="2.0"),
    }


def relay_placed(bot: Bot) -> dict[str, float]:
    """The relay pods' count of dialogue turns by where they went (summed): kept (the replica of the
    dialogue's last turn), moved (that replica could not answer), new."""
    urls = relay_metrics(bot)
    return {
        p: summed(urls, "chatfleet_relay_dialogue_turns_total", placed=p) for p in ("kept", "moved", "new")
    }


def resumes_after(bot: Bot, seen: dict[str, float]) -> dict[str, int]:
    """The relay's resumes since `seen` (its gap histogram: count, and how many within 2 s), and `seen`
    moved on to now: which fault the slow resumes followed."""
    gaps = relay_gaps(bot)
    out = {"count": int(gaps["count"] - seen["count"]), "within_2s": int(gaps["bucket"] - seen["bucket"])}
    seen.update(gaps)
    return out


def faults(kills: int = KILLS, nodes: int = NODE_LOSSES, redis: int = REDIS_RESTARTS) -> list[str]:
    """The row's faults in order: `kills` "kill"s with the `nodes` "node" losses and `redis` "redis"
    restarts spread evenly among them, a node loss first where they alternate."""
    others = [f for pair in zip_longest(["node"] * nodes, ["redis"] * redis) for f in pair if f]
    plan = ["kill"] * kills
    for i in range(len(others), 0, -1):
        plan.insert(i * kills // (len(others) + 1), others[i - 1])
    return plan


def node_to_lose(bot: Bot) -> str | None:
    """The node a loss should hit, once Ready replicas run on two nodes: of the nodes that do not hold
    the relay, the one with the most Ready replicas (None until there is such a node and a Ready replica
    elsewhere for the streams to resume on)."""
    relay = {p["spec"].get("nodeName") for p in pods(bot, RELAY)}
    ready = Counter(p["spec"].get("nodeName") for p in replicas_ready(bot))
    if len(ready) < 2:
        return None
    candidates = [n for n in ready if n not in relay]
    return max(candidates, key=lambda n: (ready[n], n)) if candidates else None


def lose_node(platform: Platform, name: str) -> dict[str, Any]:
    """Node `name` loses power (silent NODE_SILENT s, then its pods killed and its Node deleted), its pods
    are deleted, and NODE_DOWN s later it rejoins; what happened, for the fault log."""
    node = next(n for n in platform.nodes if n.name == name)
    cluster = platform.cluster
    lost = cluster.realnodes.lose_power(node, silent_seconds=NODE_SILENT)
    gone = time.monotonic()
    cluster.kubectl(
        "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={name}",
        "--grace-period=0", "--force", check=False,
    )  # fmt: skip
    time.sleep(max(0.0, NODE_DOWN - (time.monotonic() - gone)))
    cluster.realnodes.rejoin(node)
    return {
        "node": name,
        "pods_lost": len(lost),
        "back_after_s": round(time.monotonic() - gone + NODE_SILENT, 1),
    }


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


def outage_turns(results: list[Any], outages: list[tuple[float, float]], after: float = 10.0) -> list[dict]:
    """Per Redis outage, the turns that began while Redis was down and in the `after` s once it was back:
    how many of each outcome and `chatfleet.history` state ("ok/replica": answered from a replica's copy),
    and of those that began their dialogue before the kill, how many stored turns each answer loaded.
    What the replicas' copies did for the users is read here."""
    out = []
    for down, back in outages:
        view: dict[str, Any] = {}
        for label, lo, hi in (("down", down, back), ("after", back, back + after)):
            turns = [r for r in results if lo <= r.at < hi]
            view[label] = dict(Counter(f"{r.outcome}/{r.history or '-'}" for r in turns))
            view[f"{label}_history_turns_of_older_dialogues"] = dict(
                Counter(r.history_turns for r in turns if r.dialogue_started < down)
            )
        out.append(view)
    return out


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
        before, gaps_before, placed_before = relay_resumes(bot), relay_gaps(bot), relay_placed(bot)
        seen = dict(gaps_before)
        t0 = time.monotonic()
        for n, fault in enumerate(faults(), 1):
            time.sleep(INTERVAL)
            if via == "relay" and log:  # the resumes since the fault before, and how many within 2 s
                log[-1]["resumes_after"] = resumes_after(bot, seen)
            if fault == "node":
                name = bot.wait(lambda: node_to_lose(bot), 600, "Ready replicas on two nodes")
                at = round(time.monotonic() - t0, 1)
                log.append({"at_s": at, "fault": "node", **lose_node(platform, name)})
                say(f"{via}: fault {n}: {name} lost power, rejoined after {log[-1]['back_after_s']} s")
                continue
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
        if via == "relay" and log:
            log[-1]["resumes_after"] = resumes_after(bot, seen)
    finally:
        summary = load.stop()
    resumes = relay_resumes(bot) - before if via == "relay" else 0.0
    gaps = {k: v - gaps_before[k] for k, v in relay_gaps(bot).items()} if via == "relay" else {}
    placed = {k: v - placed_before[k] for k, v in relay_placed(bot).items()} if via == "relay" else {}
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
        "node_losses": sum(f["fault"] == "node" for f in log),
        "redis_restarts": sum(f["fault"] == "redis" for f in log),
        "resumes": resumes,
        "resume_gap_mean_s": round(gaps["sum"] / gaps["count"], 3) if gaps.get("count") else None,
        "resume_gaps_within_2s": f"{int(gaps['bucket'])}/{int(gaps['count'])}" if gaps else None,
        "relay_turns_placed": placed or None,
        "codes": summary["codes"],
        "errors": summary["errors"],
        "lost": summary["lost"],
        "fault_log": log,
        "redis_outage_turns": outage_turns(load.results, outages),
    }
    shown = {k: v for k, v in out.items() if k not in ("fault_log", "errors", "lost", "redis_outage_turns")}
    say(f"{via}: {shown}")
    return out


def main() -> int:
    """Both rows on one platform and the same bot; print the table and write the JSON."""
    platform = Platform()
    results: dict[str, Any] = {
        "replicas": REPLICAS,
        "users": USERS,
        "kills_per_row": KILLS,
        "node_losses_per_row": NODE_LOSSES,
        "nodes": NODES,
        "gpus_per_node": GPUS_PER_NODE,
        "node_silent_s": NODE_SILENT,
        "node_down_s": NODE_DOWN,
        "redis_restarts_per_row": REDIS_RESTARTS,
        "redis_down_s": REDIS_DOWN,
        "interval_s": INTERVAL,
        "max_tokens": MAX_TOKENS,
        "rows": [],
    }
    try:
        platform.up(real_nodes=NODES, gpus=GPUS_PER_NODE)
        bot = platform.bot(
            resources=RESOURCES,
            wait=False,
            over={  # on_real_node sets one replica: the scaling section is ours here
                "scaling": {"replicas": REPLICAS},
                "runtime": {"maxNewTokens": MAX_TOKENS},
                "streamRelay": {"enabled": True, "replicas": 1, "stallSeconds": STALL_SECONDS},
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
        f"{REPLICAS} replicas on {NODES} real nodes, {USERS} users streaming {MAX_TOKENS}-token answers; a row:"
        f" {KILLS} chat-api kills, {NODE_LOSSES} node losses ({NODE_SILENT:.0f} s silent, back {NODE_DOWN:.0f} s"
        f" later), {REDIS_RESTARTS} Redis restarts ({REDIS_DOWN:.0f} s down, nothing kept)"
    )
    print(
        table(
            results["rows"],
            [
                ("row", "row"),
                ("kills", "chat-api kills"),
                ("node_losses", "node losses"),
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
                ("relay_turns_placed", "relay: turns on the dialogue's replica (kept), moved, new"),
            ],
        )
    )
    print(f"\nwritten: {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
