"""What the answer cache buys on customer-service traffic: the same dialogues with the cache off and on.

`make bench-answer-cache` (apart from `make test`). One real tritonserver (the runtime's engine on the
Qwen2-0.5B-shaped model cut to `--layers` decoder layers, CPU; `--model tiny` for the tests' tiny one)
and Redis; two chat API processes in front of it, one after the other: without the cache (the baseline:
the same runtime as every team gets it without spec.runtime.answerCache) and with it. Both answer the
same seeded dialogues from `--users` closed-loop users: each dialogue's first turn is one of `--faqs`
frequent questions (Zipf-weighted, each asked with its own surface: case, spaces) with probability
`--repeat`, else a question of its own; half the dialogues ask one follow-up turn (history: never
cached). Greedy, `--max-tokens` per answer, not streamed.

Figures per row: turns, wall seconds, turns/s, generations Triton ran (its own count of successful
inferences), tokens generated, first-turn and all-turn latency p50/p99, the cache's hits; and the ratios
cache-on / cache-off. Writes bench-results/answer-cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chatfleet_platform.localruntime.testing import (  # noqa: E402
    ChatApiProcess,
    local_runtime,
    metric_value,
    model_config,
    post_json,
    tiny_model,
)
from percentiles import percentile  # noqa: E402

RESULTS = ROOT / "bench-results"

#: The frequent questions of a shop's support chat.
FAQS = [
    "What are your opening hours?",
    "How do I return an item?",
    "Where is my order?",
    "Do you ship abroad?",
    "How much is shipping?",
    "Can I change my delivery address?",
    "How do I reset my password?",
    "Which payment methods do you accept?",
    "How long does a refund take?",
    "Can I cancel my order?",
    "Do you have a store near me?",
    "Is this item in stock?",
    "How do I use a voucher?",
    "What is your warranty?",
    "How do I contact a person?",
    "Can I exchange a gift?",
    "Do you offer student discounts?",
    "How do I delete my account?",
    "Why was my card declined?",
    "When will my parcel arrive?",
]


def surface(question: str, rng: random.Random) -> str:
    """The same question as a user types it: case and spaces vary (the cache's key folds them)."""
    text = question.lower() if rng.random() < 0.3 else question
    return ("  " if rng.random() < 0.2 else "") + text.replace(" ", "  ", 1 if rng.random() < 0.3 else 0)


def dialogues(n: int, faqs: int, repeat: float, seed: int) -> list[list[str]]:
    """n dialogues: a first question (a frequent one with probability `repeat`, Zipf-weighted) and, for
    half of them, one follow-up."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(faqs)]
    out = []
    for i in range(n):
        if rng.random() < repeat:
            first = surface(rng.choices(FAQS[:faqs], weights)[0], rng)
        else:
            first = f"My order {1000 + i} has a problem with item {rng.randint(1, 99)}, what now?"
        turns = [first]
        if rng.random() < 0.5:
            turns.append("Thanks. And how long will that take?")
        out.append(turns)
    return out


def run_row(
    row: str, api: ChatApiProcess, triton_metrics: str, plan: list[list[str]], users: int, max_tokens: int
) -> dict:
    """Every dialogue of `plan` through `api` from `users` closed-loop users (sessions named after the
    row, so no row finds another's history); the row's figures."""
    url = f"{api.url}/v1/chat/completions"
    samples: list[dict] = []

    def dialogue(index: int) -> None:
        for turn, text in enumerate(plan[index]):
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
            body["session_id"] = f"{row}-{index}"
            t0 = time.perf_counter()
            status, answer = post_json(url, body, timeout=300)
            latency = time.perf_counter() - t0
            if status != 200:
                raise RuntimeError(f"dialogue {index} turn {turn}: {status} {answer}")
            info = answer.get("chatfleet") or {}
            samples.append(
                {
                    "first": turn == 0,
                    "latency": latency,
                    "hit": info.get("cache") == "hit",
                    "tokens": answer["usage"]["completion_tokens"],
                    "fallback": info.get("fallback", False),
                }
            )

    before = metric_value(triton_metrics, "nv_inference_request_success", model="chat")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(users) as pool:
        list(pool.map(dialogue, range(len(plan))))
    wall = time.perf_counter() - t0
    generations = metric_value(triton_metrics, "nv_inference_request_success", model="chat") - before
    first = [s["latency"] * 1000 for s in samples if s["first"]]
    every = [s["latency"] * 1000 for s in samples]
    return {
        "turns": len(samples),
        "first_turns": sum(1 for s in samples if s["first"]),
        "cache_hits": sum(1 for s in samples if s["hit"]),
        "fallbacks": sum(1 for s in samples if s["fallback"]),
        "wall_s": round(wall, 1),
        "turns_per_s": round(len(samples) / wall, 2),
        "triton_generations": int(generations),
        "tokens_generated": sum(s["tokens"] for s in samples if not s["hit"]),
        "first_turn_ms": {"p50": round(percentile(first, 0.5)), "p99": round(percentile(first, 0.99))},
        "all_turns_ms": {"p50": round(percentile(every, 0.5)), "p99": round(percentile(every, 0.99))},
    }


def table(result: dict) -> str:
    off, on = result["rows"]["cache_off"], result["rows"]["cache_on"]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"

    lines = [
        f"{'':34} {'cache off':>12} {'cache on':>12} {'on / off':>9}",
        *(
            f"{name:34} {a!s:>12} {b!s:>12} {ratio(b, a):>9}"
            for name, a, b in (
                ("turns", off["turns"], on["turns"]),
                ("cache hits", off["cache_hits"], on["cache_hits"]),
                ("generations Triton ran", off["triton_generations"], on["triton_generations"]),
                ("tokens generated", off["tokens_generated"], on["tokens_generated"]),
                ("wall s", off["wall_s"], on["wall_s"]),
                ("turns/s", off["turns_per_s"], on["turns_per_s"]),
                ("first turn p50 ms", off["first_turn_ms"]["p50"], on["first_turn_ms"]["p50"]),
                ("first turn p99 ms", off["first_turn_ms"]["p99"], on["first_turn_ms"]["p99"]),
                ("all turns p50 ms", off["all_turns_ms"]["p50"], on["all_turns_ms"]["p50"]),
                ("all turns p99 ms", off["all_turns_ms"]["p99"], on["all_turns_ms"]["p99"]),
            )
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("shaped", "tiny"), default="shaped")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the shaped model")
    ap.add_argument("--dialogues", type=int, default=300)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--faqs", type=int, default=20)
    ap.add_argument(
        "--repeat", type=float, default=0.7, help="share of first turns that are frequent questions"
    )
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", default=str(ROOT / ".work" / "bench-answer-cache"))
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.model == "shaped":
        from chatfleet_platform.localruntime.shaped import build_shaped_model

        model_dir = build_shaped_model(workdir / f"shaped-{args.layers}-model", layers=args.layers)
    else:
        model_dir = tiny_model(workdir)
    plan = dialogues(args.dialogues, args.faqs, args.repeat, args.seed)
    config = model_config(
        model_dir, max_new_tokens=max(64, args.max_tokens), torch_threads=os.cpu_count() or 1
    )
    result: dict = {
        "cpus": os.cpu_count(),
        "model": f"{args.model}" + (f" ({args.layers} layers)" if args.model == "shaped" else ""),
        "dialogues": args.dialogues,
        "users": args.users,
        "faqs": args.faqs,
        "repeat": args.repeat,
        "max_tokens": args.max_tokens,
        "rows": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="chatfleet-cachebench-") as tmp,
        local_runtime(
            Path(tmp),
            model_dir=model_dir,
            config=config,
            api_env={"CHATFLEET_REQUEST_TIMEOUT_SECONDS": "300"},
        ) as rt,
    ):
        env = {
            "CHATFLEET_MODEL_NAME": "chatfleet-tiny",
            "CHATFLEET_REDIS_URL": rt.redis.url,
            "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "300",
        }
        for name, extra in (("cache_off", {}), ("cache_on", {"CHATFLEET_ANSWER_CACHE": "true"})):
            print(f"[bench-answer-cache] {name}: {len(plan)} dialogues from {args.users} users", flush=True)
            api = ChatApiProcess(rt.triton.grpc_url, {**env, **extra}, log_path=Path(tmp) / f"api-{name}.log")
            api.start()
            try:
                result["rows"][name] = run_row(
                    name, api, rt.triton.metrics_url, plan, args.users, args.max_tokens
                )
            finally:
                api.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "answer-cache.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"\nwritten: {RESULTS / 'answer-cache.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
