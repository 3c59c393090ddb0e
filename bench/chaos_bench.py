"""Replicas killed, frozen and Redis restarted mid-answer under streamed dialogues: the stream relay's resume
beside the same run without it.

`make bench-chaos` (apart from `make test`). Processes on 127.0.0.1, not pods (the relay the operator runs
on real pods is a test: tests/realnode/test_realnode_stream_relay.py): `--replicas` replicas, each a real tritonserver (the tests' tiny model, CPU) and a chat API,
over one real Redis; the stream relay (`python -m chatfleet_runtime.relay`) in front of them; `--dialogues`
closed-loop dialogues, each streaming turns with the stock OpenAI SDK (async), `--max-tokens` per answer
(the end-of-sequence token suppressed, so every answer is that long), a session id per dialogue so the
history lives in Redis.

While they run, a fault every `--interval` seconds (after the last one's recovery), in the order
`fault_plan` spreads them, each to a replica that is up:
- `kill` (`--kills`): SIGKILL of one replica's two processes (a pod that dies: OOM, eviction past its
  grace), then started again on the same ports;
- `node` (`--node-losses`): one replica's processes frozen with SIGSTOP for `--freeze-seconds` (a node
  that lost power or its network: no bytes, no close, no RST), then killed and started again (the pod
  rescheduled); the relay sees its streams go silent and resumes them after `--stall-seconds` (1.5 s: the
  relay asks the replicas for a heartbeat every quarter of it while a token is slow, so a slow answer is
  never silent);
- `redis` (`--redis-restarts`): Redis SIGKILLed and started again `--redis-down-seconds` later on its port
  with its append-only file (a Redis pod's container restarted; a Redis without persistence would come
  back empty: docs/operator.md "What survives what"). The chat API's store retries a read or a write for
  4 s, so an outage shorter than that costs no turn.

Two rows, the same faults and load, one after the other:
- `resume`: the relay as shipped (a cut stream continued on another replica, `--max-resumes 3`);
- `no-resume` (the baseline: the best a client gets without it, a proxy that tries the next replica when
  one cannot be reached or answers 502/503/504 before streaming, and passes a cut on): the relay with
  `--max-resumes 0`.

Figures per row: the faults by kind, turns asked, completed ([DONE] reached), cut (the stream ended without completing: the
SDK raised), refused (non-2xx before streaming), lost turns (completed but not in the history), doubled
turns (in the history more than once), the relay's resumes, and each turn's longest silence between two
chunks after the first (p50, p99, max; a resume shows as one such gap), and the time to the first chunk
(p50); the relay's own measure of each resume's silence (from the last chunk before the cut to the first
text after it: mean, and how many within 2 s), its resumes by reason (`closed`, `stalled`, `error_event`).
Writes bench-results/chaos.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import openai  # noqa: E402
import redis  # noqa: E402
from chatfleet_platform.localruntime.testing import (  # noqa: E402
    RelayProcess,
    Replica,
    metric_value,
    model_config,
    tiny_model,
)
from chatfleet_platform.servers.services import Redis  # noqa: E402
from chatfleet_runtime.launcher.tritonhome import local_repository  # noqa: E402
from percentiles import percentile  # noqa: E402

RESULTS = ROOT / "bench-results"
MODEL = "tiny-chat"


def replica_env(redis_url: str) -> dict[str, str]:
    """The chat API's environment: the history in Redis, a long deadline, no in-flight limit in the way."""
    return {
        "CHATFLEET_MODEL_NAME": MODEL,
        "CHATFLEET_REDIS_URL": redis_url,
        "CHATFLEET_HISTORY_TURNS": "50",
        "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "120",
        "CHATFLEET_MAX_INFLIGHT": "64",
    }


async def dialogue(client, eos, n, args, stop: asyncio.Event, record: list, prefix: str) -> None:
    """Closed loop: dialogues of `args.turns` turns until `stop`; each turn one record."""
    round_ = 0
    while not stop.is_set():
        sid = f"{prefix}-{n}-{round_}"
        round_ += 1
        for turn in range(args.turns):
            entry = {"session": sid, "turn": turn, "outcome": None, "gap_s": 0.0, "ttft_s": None}
            t0 = time.monotonic()
            t_last = None
            parts = []
            try:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"Dialogue {n}, question {turn}: tell me more."}],
                    max_tokens=args.max_tokens,
                    temperature=0.7,
                    logit_bias={str(eos): -100},
                    stream=True,
                    extra_body={"session_id": sid},
                )
                async for chunk in stream:
                    now = time.monotonic()
                    if t_last is None:
                        entry["ttft_s"] = now - t0
                    else:
                        entry["gap_s"] = max(entry["gap_s"], now - t_last)
                    t_last = now
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                entry["outcome"] = "completed"
            except openai.APIStatusError as exc:
                entry["outcome"], entry["status"] = "refused", exc.status_code
            except (openai.APIError, openai.APIConnectionError) as exc:
                entry["outcome"], entry["error"] = "cut", str(exc)[:120]
            entry["chars"] = sum(len(p) for p in parts)
            record.append(entry)
            if entry["outcome"] != "completed":
                break  # a user whose answer failed starts again


def fault_plan(kills: int, nodes: int, restarts: int) -> list[str]:
    """The faults in order: the pod kills, with the node losses and the Redis restarts spread among them
    (none first, so the load is under way).

    >>> fault_plan(10, 2, 2)
    ['kill', 'kill', 'node', 'kill', 'kill', 'redis', 'kill', 'kill', 'kill', 'kill', 'node', 'kill', 'redis', 'kill']
    >>> fault_plan(0, 1, 1)
    ['node', 'redis']
    """
    plan = ["kill"] * kills
    for kind, count, shift in (("node", nodes, 0.0), ("redis", restarts, 0.5)):
        spaced = [int((i + 0.5 + shift) * (kills + 1) / max(count, 1)) for i in range(count)]
        for n, at in enumerate(spaced):
            plan.insert(min(at + n, len(plan)), kind)
    return plan


async def faults(replicas: list[Replica], redis_srv: Redis, args, stop: asyncio.Event, log: list) -> None:
    """The fault plan, one every interval after the last one's recovery, each on a replica that is up (the
    Redis restarts on Redis); then the tail, then stop the load."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(args.warmup)
    plan = fault_plan(args.kills, args.node_losses, args.redis_restarts)
    for i, kind in enumerate(plan):
        entry = {"kind": kind, "at_s": round(time.monotonic(), 1)}
        if kind == "redis":
            await loop.run_in_executor(None, redis_srv.kill)
            await asyncio.sleep(args.redis_down_seconds)
            await loop.run_in_executor(None, redis_srv.start)
        else:
            victim = next(r for r in replicas[i % len(replicas) :] + replicas if r.up)
            entry["replica"] = victim.api.log_path.stem
            if kind == "node":
                victim.signal(signal.SIGSTOP)
                await asyncio.sleep(args.freeze_seconds)
            victim.kill()
            await loop.run_in_executor(None, lambda v=victim: v.start(300))
        log.append(entry)
        await asyncio.sleep(args.interval)
    await asyncio.sleep(args.tail)
    stop.set()


def resumes_by_reason(url: str) -> dict[str, int]:
    """The relay's chatfleet_relay_resumes_total by its reason label."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found = re.findall(r'^chatfleet_relay_resumes_total\{reason="([^"]+)"\} ([0-9.e+]+)$', text, re.M)
    return {reason: int(float(value)) for reason, value in found}


def history_counts(redis_url: str, prefix: str) -> dict[str, int]:
    store = redis.Redis.from_url(redis_url)
    counts = {}
    for key in store.scan_iter(f"chatfleet:session:{MODEL}:{prefix}-*"):
        counts[key.decode().rsplit(":", 1)[1]] = store.llen(key)
    return counts


def run_row(name: str, max_resumes: int, replicas, redis_srv, workdir, eos, args) -> dict:
    relay = RelayProcess(
        [r.api.url for r in replicas],
        log_path=workdir / f"relay-{name}.log",
        max_resumes=max_resumes,
        stall_seconds=args.stall_seconds,
    )
    relay.start()
    record: list[dict] = []
    kills: list[dict] = []

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=f"{relay.url}/v1", api_key="unused", max_retries=0, timeout=180)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(dialogue(client, eos, n, args, stop, record, name))
            for n in range(args.dialogues)
        ]
        await faults(replicas, redis_srv, args, stop, kills)
        await asyncio.gather(*tasks)
        await client.close()

    t0 = time.monotonic()
    try:
        asyncio.run(main())
        resumes = metric_value(relay.metrics_url, "chatfleet_relay_resumes_total")
        reasons = resumes_by_reason(relay.metrics_url)
        gap = {
            key: metric_value(relay.metrics_url, f"chatfleet_relay_resume_gap_seconds_{key}", **labels)
            for key, labels in (("count", {}), ("sum", {}), ("bucket", {"le": "2.0"}))
        }
    finally:
        relay.stop()
    wall = time.monotonic() - t0
    stored = history_counts(redis_srv.url, name)
    completed: dict[str, int] = {}
    for e in record:
        if e["outcome"] == "completed":
            completed[e["session"]] = completed.get(e["session"], 0) + 1
    lost = sum(max(0, n - stored.get(s, 0)) for s, n in completed.items())
    doubled = sum(max(0, n - completed.get(s, 0)) for s, n in stored.items())
    gaps = sorted(e["gap_s"] for e in record if e["outcome"] == "completed")
    ttfts = sorted(e["ttft_s"] for e in record if e["ttft_s"] is not None)
    outcomes = {k: sum(1 for e in record if e["outcome"] == k) for k in ("completed", "cut", "refused")}
    return {
        "row": name,
        "max_resumes": max_resumes,
        "wall_s": round(wall, 1),
        "turns": len(record),
        **outcomes,
        "lost_turns": lost,
        "doubled_turns": doubled,
        "faults": dict(Counter(k["kind"] for k in kills)),
        "resumes": int(resumes),
        "resumes_by_reason": reasons,
        "resume_gap_mean_s": round(gap["sum"] / gap["count"], 3) if gap["count"] else None,
        "resume_gaps_within_2s": f"{int(gap['bucket'])}/{int(gap['count'])}",
        "kills": kills,
        "gap_p50_s": round(percentile(gaps, 0.5), 3) if gaps else None,
        "gap_p99_s": round(percentile(gaps, 0.99), 3) if gaps else None,
        "gap_max_s": round(gaps[-1], 3) if gaps else None,
        "ttft_p50_s": round(percentile(ttfts, 0.5), 3) if ttfts else None,
        "statuses": sorted({e.get("status") for e in record if e.get("status")}),
        "errors": sorted({e["error"] for e in record if e.get("error")})[:5],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--dialogues", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--node-losses", type=int, default=2)
    parser.add_argument("--redis-restarts", type=int, default=2)
    parser.add_argument(
        "--freeze-seconds", type=float, default=10.0, help="how long a lost node stays silent"
    )
    parser.add_argument("--redis-down-seconds", type=float, default=2.0)
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=1.5,
        help="the relay's --stall-seconds (a stream this silent is cut; the replicas send heartbeats every "
        "quarter of it while a token is slow, so silence means a replica gone, not a slow answer)",
    )
    parser.add_argument(
        "--interval", type=float, default=3.0, help="seconds between a restart and the next kill"
    )
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first kill")
    parser.add_argument("--tail", type=float, default=5.0, help="seconds of load after the last restart")
    parser.add_argument("--rows", default="resume,no-resume")
    parser.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="chatfleet-chaos-"))
    model_dir = tiny_model(workdir)
    from chatfleet_runtime.engine.loading import load_tokenizer

    eos = load_tokenizer(model_dir).eos_token_id
    config = model_config(model_dir, max_context_tokens=2048, max_new_tokens=max(args.max_tokens, 64))
    repo = local_repository(workdir / "repo", config)
    redis_srv = Redis(workdir / "redis", persistent=True).start()
    replicas = [
        Replica.create(workdir, repo, f"r{i}", replica_env(redis_srv.url)) for i in range(args.replicas)
    ]
    rows = []
    try:
        for r in replicas:
            r.start()
        for name in args.rows.split(","):
            plan = fault_plan(args.kills, args.node_losses, args.redis_restarts)
            print(f"[chaos] row {name}: {args.dialogues} dialogues, faults {plan} ...", flush=True)
            row = run_row(name, 3 if name == "resume" else 0, replicas, redis_srv, workdir, eos, args)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kills"}), flush=True)
    finally:
        for r in replicas:
            r.stop()
        redis_srv.stop()
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    keys = [
        "turns",
        "completed",
        "cut",
        "refused",
        "lost_turns",
        "doubled_turns",
        "faults",
        "resumes",
        "resumes_by_reason",
        "resume_gap_mean_s",
        "resume_gaps_within_2s",
        "gap_p50_s",
        "gap_p99_s",
        "gap_max_s",
        "ttft_p50_s",
    ]
    print("\n| row | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for row in rows:
        print(f"| {row['row']} | " + " | ".join(str(row[k]) for k in keys) + " |")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
