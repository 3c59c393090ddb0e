"""Runtime benchmark: the chat runtime vs a naive transformers baseline, same model, same machine.

(a) the runtime: Redis + the real tritonserver (dynamic batching, one generate per batch) + the chat API,
    driven over HTTP with streaming (server-sent events), like a real client;
(b) the baseline: ``model.generate()`` per request, one request at a time, in process (a FIFO worker).

At 1, 8 and 32 concurrent conversations (closed loop): tokens per second, time to first token p50/p99
and whole-response latency p50/p99. Multi-turn: second-turn latency at about 1,000 tokens of history with
KV-prefix reuse vs recompute (the same request to Triton with ``prefix_cache: false``). Precision: int8
(dynamic quantisation) vs fp32, weights memory and batched tokens/s, in process (``--precision-only``
runs just that row).

Writes bench-results/runtime.json and bench-results/runtime.png and prints a table with ratios.
CPU only: no GPU machine is lent to this task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))

from chatfleet_platform.localruntime.testing import local_runtime, model_config, tiny_model  # noqa: E402

CONCURRENCY = (1, 8, 32)
MAX_TOKENS = 128  # a typical chat answer; --max-tokens changes it (both sides)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summarize(samples: list[dict], wall_s: float) -> dict:
    """tokens/s over the wall time, TTFT and latency percentiles in milliseconds."""
    tokens = sum(s["tokens"] for s in samples)
    ttft = [s["ttft"] * 1000 for s in samples]
    lat = [s["latency"] * 1000 for s in samples]
    return {
        "requests": len(samples),
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(tokens / wall_s, 1),
        "ttft_ms_p50": round(pct(ttft, 50), 1),
        "ttft_ms_p99": round(pct(ttft, 99), 1),
        "latency_ms_p50": round(pct(lat, 50), 1),
        "latency_ms_p99": round(pct(lat, 99), 1),
    }


def prompt_for(conv: int, turn: int) -> list[dict[str, str]]:
    """A distinct short user message per conversation and turn."""
    return [
        {"role": "user", "content": f"Conversation {conv}, question {turn}: how do pods scale on Kubernetes?"}
    ]


# ---- (a) the runtime ------------------------------------------------------------------------------


async def runtime_level(api_url: str, concurrency: int, per_conv: int) -> dict:
    """Closed loop: `concurrency` conversations, each sending `per_conv` streamed requests in sequence.

    The load generator uses aiohttp (C-accelerated HTTP parsing): it shares the two CPUs with the
    runtime, so a heavy client would be measured as runtime overhead.
    """
    import aiohttp

    samples: list[dict] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:

        async def conversation(conv: int) -> None:
            for turn in range(per_conv):
                body = {"messages": prompt_for(conv, turn), "max_tokens": MAX_TOKENS, "stream": True}
                t0 = time.perf_counter()
                first = None
                tokens = 0
                async with client.post(f"{api_url}/v1/chat/completions", json=body) as resp:
                    resp.raise_for_status()
                    async for raw in resp.content:
                        line = raw.decode().rstrip("\n")
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        # Parse only what is needed.
                        if first is None and '"content": "' in line and '"content": ""' not in line:
                            first = time.perf_counter()
                        if '"usage"' in line or '"fallback": true' in line:
                            event = json.loads(line[6:])
                            if event["chatfleet"].get("fallback"):
                                raise RuntimeError(
                                    f"fallback answer during the benchmark: {event['chatfleet']}"
                                )
                            tokens = event["usage"]["completion_tokens"]
                end = time.perf_counter()
                samples.append({"ttft": (first or end) - t0, "latency": end - t0, "tokens": tokens})

        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(c) for c in range(concurrency)))
        wall = time.perf_counter() - t0
    return summarize(samples, wall)


def multiturn(triton_grpc: str, tokenizer, reps: int, max_tokens: int = 16) -> dict:
    """Second turn at ~1,000 tokens of history, streamed: prefix reuse (session) vs recompute.

    Both variants send the same messages to Triton's chat_stream model; "recompute" only adds
    ``prefix_cache: false``. Reports time to first token and whole-response latency (p50).
    """
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(triton_grpc)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))

    def call(messages, params) -> tuple[float, float, str]:
        a = grpcclient.InferInput("MESSAGES", [1, 1], "BYTES")
        a.set_data_from_numpy(np.array([[json.dumps(messages).encode()]], dtype=np.object_))
        b = grpcclient.InferInput("PARAMETERS", [1, 1], "BYTES")
        b.set_data_from_numpy(np.array([[json.dumps(params).encode()]], dtype=np.object_))
        t0 = time.perf_counter()
        client.async_stream_infer("chat_stream", [a, b])
        first, parts = None, []
        while True:
            result, error = events.get(timeout=120)
            if error is not None:
                raise RuntimeError(str(error))
            text = result.as_numpy("TEXT")[0].decode("utf-8", "replace")
            if text and first is None:
                first = time.perf_counter()
            parts.append(text)
            if result.as_numpy("FINISH_REASON")[0]:
                end = time.perf_counter()
                return (first or end) - t0, end - t0, "".join(parts)

    system = {"role": "system", "content": "You are the Chatfleet assistant. Answer briefly."}
    # About 1,000 tokens of history: grow the filler until the second-turn prompt reaches it.
    sentences: list[str] = []
    while len(tokenizer(" ".join(sentences), add_special_tokens=False)["input_ids"]) < 960:
        sentences.append(f"Fact {len(sentences)}: the cluster has {len(sentences) * 7} pods.")
    filler = " ".join(sentences)
    samples: dict[str, dict[str, list[float]]] = {
        k: {"ttft": [], "latency": []} for k in ("reuse", "recompute")
    }
    history_tokens = 0
    try:
        for rep in range(reps):
            sid = f"bench-mt-{rep}-{time.time_ns()}"
            turn1 = [system, {"role": "user", "content": f"[{rep}] Remember this: {filler}"}]
            _, _, reply = call(turn1, {"max_tokens": max_tokens, "session_id": sid})
            turn2 = [
                *turn1,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "Summarize it."},
            ]
            text = tokenizer.apply_chat_template(turn2, tokenize=False, add_generation_prompt=True)
            history_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            # Alternate the order so neither variant always runs on a warmer machine.
            order = [("reuse", {"session_id": sid}), ("recompute", {"prefix_cache": False})]
            for kind, extra in order if rep % 2 == 0 else order[::-1]:
                ttft, latency, _ = call(turn2, {"max_tokens": max_tokens, **extra})
                samples[kind]["ttft"].append(ttft * 1000)
                samples[kind]["latency"].append(latency * 1000)
    finally:
        client.stop_stream()
        client.close()
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in samples.items()}
    return {
        "history_tokens": history_tokens,
        "max_tokens": max_tokens,
        "repetitions": reps,
        "reuse_ttft_ms_p50": round(med["reuse"]["ttft"], 1),
        "recompute_ttft_ms_p50": round(med["recompute"]["ttft"], 1),
        "ttft_ratio": round(med["reuse"]["ttft"] / med["recompute"]["ttft"], 3),
        "reuse_ms_p50": round(med["reuse"]["latency"], 1),
        "recompute_ms_p50": round(med["recompute"]["latency"], 1),
        "ratio": round(med["reuse"]["latency"] / med["recompute"]["latency"], 3),
    }


# ---- (b) the naive baseline -------------------------------------------------------------------------


class Baseline:
    """transformers generate() per request, one at a time (a FIFO worker thread), clients submit concurrently."""

    def __init__(self, model_dir: Path, threads: int):
        import torch
        from chatfleet_runtime.loading import choose_placement, load_model, load_tokenizer

        self.torch, self.threads = torch, threads
        self.tokenizer = load_tokenizer(model_dir)
        self.model = load_model(model_dir, choose_placement("fp32", "KIND_CPU", cuda_available=False))
        self.specials = [i for i in self.tokenizer.all_special_ids if i != self.tokenizer.eos_token_id]
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._worker, daemon=True)
        self.thread.start()
        self.submit_and_wait(prompt_for(0, 0))  # warm-up

    def _worker(self) -> None:
        from transformers.generation.streamers import BaseStreamer

        torch, tokenizer = self.torch, self.tokenizer
        torch.set_num_threads(self.threads)  # OpenMP thread counts are per thread: set it where generate runs

        class FirstToken(BaseStreamer):
            def __init__(self):
                self.calls = 0
                self.first: float | None = None

            def put(self, value):
                self.calls += 1
                if self.calls == 2 and self.first is None:  # call 1 is the prompt
                    self.first = time.perf_counter()

            def end(self):
                pass

        while True:
            job = self.jobs.get()
            if job is None:
                return
            messages, t_submit, done = job
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            streamer = FirstToken()
            with torch.inference_mode():
                out = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=MAX_TOKENS,
                    do_sample=False,
                    suppress_tokens=self.specials,
                    streamer=streamer,
                    pad_token_id=tokenizer.pad_token_id,
                )
            tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            end = time.perf_counter()
            done(
                {
                    "ttft": (streamer.first or end) - t_submit,
                    "latency": end - t_submit,
                    "tokens": out.shape[1] - ids.shape[1],
                }
            )

    def submit_and_wait(self, messages) -> dict:
        """Queue one request and wait for its measurements."""
        box: queue.Queue = queue.Queue()
        self.jobs.put((messages, time.perf_counter(), box.put))
        return box.get()

    def level(self, concurrency: int, per_conv: int) -> dict:
        """Closed loop: `concurrency` client threads, each sending `per_conv` requests in sequence."""
        samples: list[dict] = []
        lock = threading.Lock()

        def conversation(conv: int) -> None:
            for turn in range(per_conv):
                s = self.submit_and_wait(prompt_for(conv, turn))
                with lock:
                    samples.append(s)

        t0 = time.perf_counter()
        clients = [threading.Thread(target=conversation, args=(c,)) for c in range(concurrency)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        return summarize(samples, time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the worker."""
        self.jobs.put(None)
        self.thread.join(10)


# ---- precision: int8 vs fp32 -----------------------------------------------------------------------


def precision_rows(
    model_dir: Path, threads: int, *, batch: int = 8, max_tokens: int = 64, reps: int = 3
) -> dict:
    """int8 vs fp32 on CPU with the production loader and BatchGenerator: weights MiB and tokens/s.

    One greedy batch of `batch` requests, `max_tokens` each, best of `reps` (after a warm-up batch).
    """
    import torch
    from chatfleet_runtime.generation import BatchGenerator
    from chatfleet_runtime.loading import choose_placement, load_model, load_tokenizer, weights_bytes
    from chatfleet_runtime.prompting import SamplingParams, render_prompt
    from chatfleet_runtime.rows import GenerationRequest

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(model_dir)
    prompts = [
        render_prompt(tokenizer, prompt_for(i, 0), max_context_tokens=2048, max_new_tokens=max_tokens).ids
        for i in range(batch)
    ]
    out: dict[str, dict] = {}
    for precision in ("fp32", "int8"):
        model = load_model(model_dir, choose_placement(precision, "KIND_CPU", cuda_available=False))
        gen = BatchGenerator(model, tokenizer)
        requests = [GenerationRequest(p, SamplingParams(max_new_tokens=max_tokens)) for p in prompts]
        gen.generate(requests[:2])  # warm-up
        best = 0.0
        for _ in range(reps):
            t0 = time.perf_counter()
            results = gen.generate(requests)
            tokens = sum(len(r.token_ids) for r in results)
            best = max(best, tokens / (time.perf_counter() - t0))
        out[precision] = {
            "weights_mib": round(weights_bytes(model) / 2**20, 2),
            "tokens_per_s": round(best, 1),
        }
    out["int8_vs_fp32"] = {
        "memory_ratio": round(out["int8"]["weights_mib"] / out["fp32"]["weights_mib"], 3),
        "tokens_per_s_ratio": round(out["int8"]["tokens_per_s"] / out["fp32"]["tokens_per_s"], 3),
        "batch": batch,
        "max_tokens": max_tokens,
    }
    return out


def precision_table(p: dict) -> list[str]:
    """Rows of the int8 vs fp32 comparison."""
    r = p["int8_vs_fp32"]
    return [
        f"precision (in process, batch {r['batch']} x {r['max_tokens']} tokens, greedy):",
        f"    fp32 weights {p['fp32']['weights_mib']:.2f} MiB, {p['fp32']['tokens_per_s']:.0f} tok/s",
        f"    int8 weights {p['int8']['weights_mib']:.2f} MiB, {p['int8']['tokens_per_s']:.0f} tok/s "
        f"(memory {r['memory_ratio']:.2f}x, tokens/s {r['tokens_per_s_ratio']:.2f}x of fp32)",
    ]


# ---- report --------------------------------------------------------------------------------------


def table(result: dict) -> str:
    """The side-by-side table with ratios."""
    rt, bl = result["runtime"], result["baseline"]
    lines = [
        f"chatfleet runtime benchmark - model {result['model']['size']} ({result['model']['parameters']:,} params), "
        f"{result['machine']['device']}, {result['machine']['cpus']} CPUs, torch threads {result['config']['torch_threads']}",
        "NOTE: CPU only - no GPU machine is lent to this task.",
        "",
        f"{'conc':>4} | {'tok/s runtime':>13} {'baseline':>9} {'ratio':>6} | {'TTFT p50 rt':>11} {'bl':>8} | "
        f"{'TTFT p99 rt':>11} {'bl':>8} | {'lat p50 rt':>10} {'bl':>8} | {'lat p99 rt':>10} {'bl':>8}",
    ]
    for c in CONCURRENCY:
        r, b = rt[str(c)], bl[str(c)]
        lines.append(
            f"{c:>4} | {r['tokens_per_s']:>13.0f} {b['tokens_per_s']:>9.0f} {r['tokens_per_s'] / b['tokens_per_s']:>5.1f}x | "
            f"{r['ttft_ms_p50']:>9.1f}ms {b['ttft_ms_p50']:>6.1f}ms | {r['ttft_ms_p99']:>9.1f}ms {b['ttft_ms_p99']:>6.1f}ms | "
            f"{r['latency_ms_p50']:>8.1f}ms {b['latency_ms_p50']:>6.1f}ms | {r['latency_ms_p99']:>8.1f}ms {b['latency_ms_p99']:>6.1f}ms"
        )
    g = result["goals"]
    mt = result["multiturn"]
    lines += [
        "",
        f"goal 1: tokens/s at 32 conversations >= 10x baseline: {g['throughput_ratio_32']:.1f}x "
        f"(vs the baseline's best level: {g['throughput_ratio_32_vs_best_baseline']:.1f}x) -> {'MET' if g['throughput_met'] else 'NOT MET'}",
        f"goal 2: p50 latency at 32 <= 1.5x baseline single-request p50: {g['latency_ratio_32_vs_baseline_1']:.2f}x "
        f"-> {'MET' if g['latency_met'] else 'NOT MET'}",
        f"goal 3: second turn at {mt['history_tokens']} tokens of history, prefix reuse vs recompute "
        f"(p50 of {mt['repetitions']}, {mt['max_tokens']} new tokens):",
    ]
    for label, m in (("tiny (bench model)", mt), ("small (4x256)", result.get("multiturn_small_model"))):
        if not m:
            continue
        lines.append(
            f"    {label:<19} latency {m['reuse_ms_p50']:.1f}ms vs {m['recompute_ms_p50']:.1f}ms = {m['ratio']:.2f}x; "
            f"TTFT {m['reuse_ttft_ms_p50']:.1f}ms vs {m['recompute_ttft_ms_p50']:.1f}ms = {m['ttft_ratio']:.2f}x"
        )
    lines.append(
        f"    -> whole-response latency ratio (goal <= 0.5x): tiny {g['prefix_ratio']:.2f}x "
        f"{'MET' if g['prefix_met'] else 'NOT MET'}; small "
        + (
            f"{g['prefix_ratio_small']:.2f}x {'MET' if g['prefix_met_small'] else 'NOT MET'}"
            if g.get("prefix_ratio_small")
            else "n/a"
        )
    )
    if result.get("precision"):
        lines += ["", *precision_table(result["precision"])]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """PNG with throughput, TTFT and latency curves and the multi-turn bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    xs = list(CONCURRENCY)
    for label, key, style in (("runtime", "runtime", "o-"), ("baseline", "baseline", "s--")):
        data = result[key]
        axes[0].plot(xs, [data[str(c)]["tokens_per_s"] for c in xs], style, label=label)
        axes[1].plot(xs, [data[str(c)]["ttft_ms_p50"] for c in xs], style, label=f"{label} p50")
        axes[1].plot(xs, [data[str(c)]["ttft_ms_p99"] for c in xs], style, alpha=0.5, label=f"{label} p99")
        axes[2].plot(xs, [data[str(c)]["latency_ms_p50"] for c in xs], style, label=f"{label} p50")
        axes[2].plot(xs, [data[str(c)]["latency_ms_p99"] for c in xs], style, alpha=0.5, label=f"{label} p99")
    for ax, title, unit in (
        (axes[0], "throughput", "tokens/s"),
        (axes[1], "time to first token", "ms"),
        (axes[2], "whole response latency", "ms"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent conversations")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    groups = [("tiny", result["multiturn"]), ("small", result.get("multiturn_small_model"))]
    groups = [(name, m) for name, m in groups if m]
    xs3 = range(len(groups))
    axes[3].bar(
        [x - 0.2 for x in xs3],
        [m["reuse_ms_p50"] for _, m in groups],
        0.4,
        label="prefix reuse",
        color="tab:green",
    )
    axes[3].bar(
        [x + 0.2 for x in xs3],
        [m["recompute_ms_p50"] for _, m in groups],
        0.4,
        label="recompute",
        color="tab:gray",
    )
    axes[3].set_xticks(list(xs3), [f"{name}\n{m['ratio']:.2f}x" for name, m in groups])
    axes[3].set_title(f"2nd turn at ~{groups[0][1]['history_tokens']} tokens of history (p50)")
    axes[3].set_ylabel("ms")
    axes[3].legend(fontsize=7)
    fig.suptitle(
        f"chatfleet runtime vs naive generate() - {result['model']['size']} model, CPU only (no GPU lent)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run both sides, write the JSON and PNG, print the table."""
    global MAX_TOKENS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size",
        choices=("tiny", "small"),
        default="tiny",
        help="model built by chatfleet_platform.localruntime.tiny",
    )
    parser.add_argument("--workdir", default=str(ROOT / ".work" / "bench-runtime"))
    parser.add_argument("--out", default=str(ROOT / "bench-results"))
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads, both sides (1 is fastest on a busy 2-core box)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    parser.add_argument(
        "--queue-delay-us",
        type=int,
        default=10_000,
        help="Triton max_queue_delay_microseconds (the CRD default)",
    )
    parser.add_argument(
        "--no-multiturn-small",
        dest="multiturn_small",
        action="store_false",
        help="skip the small-model multi-turn run",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=MAX_TOKENS, help="tokens generated per request (both sides)"
    )
    parser.add_argument(
        "--precision-only", action="store_true", help="only the int8 vs fp32 row (in process, seconds)"
    )
    args = parser.parse_args(argv)
    MAX_TOKENS = args.max_tokens
    workdir, out = Path(args.workdir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_conv = {1: 8, 8: 4, 32: 3} if not args.quick else {1: 3, 8: 2, 32: 1}
    model_dir = tiny_model(workdir, size=args.size)
    if args.precision_only:
        print("\n".join(precision_table(precision_rows(model_dir, args.threads))))
        return 0

    from chatfleet_runtime.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    cfg = model_config(
        model_dir,
        max_batch_size=32,
        max_queue_delay_us=args.queue_delay_us,
        max_new_tokens=max(256, MAX_TOKENS),
        torch_threads=args.threads,
    )
    print(f"runtime (Triton + chat API + Redis) and baseline (generate() one at a time), {args.size} model;")
    print("levels interleaved (runtime then baseline) so machine noise hits both alike ...", flush=True)
    runtime: dict[str, dict] = {}
    bl: dict[str, dict] = {}
    base = Baseline(model_dir, args.threads)
    try:
        with local_runtime(workdir / "rt", model_dir=model_dir, config=cfg) as rt:
            asyncio.run(runtime_level(rt.api_url, 4, 2))  # warm-up
            for c in CONCURRENCY:
                runtime[str(c)] = asyncio.run(runtime_level(rt.api_url, c, per_conv[c]))
                print(f"  runtime  c={c}: {runtime[str(c)]}", flush=True)
                bl[str(c)] = base.level(c, per_conv[c])
                print(f"  baseline c={c}: {bl[str(c)]}", flush=True)
            print("multi-turn: prefix reuse vs recompute ...", flush=True)
            mt = multiturn(rt.triton.grpc_url, tokenizer, reps=4 if args.quick else 8)
            print(f"  {mt}", flush=True)
    finally:
        base.close()
    mt_small = None
    if args.multiturn_small:
        from chatfleet_runtime.tritonhome import running_triton

        small_dir = tiny_model(workdir, size="small")
        small_cfg = model_config(small_dir, max_batch_size=8, max_new_tokens=64, torch_threads=args.threads)
        print("multi-turn on the small model (4 layers, hidden 256: prefill costs more) ...", flush=True)
        from chatfleet_runtime.tritonhome import local_repository

        repo = local_repository(workdir / "small-repo", small_cfg)
        with running_triton(
            repo, home=workdir / "rt" / "triton-home", log_path=workdir / "triton-small.log"
        ) as srv:
            mt_small = multiturn(srv.grpc_url, load_tokenizer(small_dir), reps=4 if args.quick else 6)
        print(f"  {mt_small}", flush=True)

    print("precision: int8 vs fp32 ...", flush=True)
    precision = precision_rows(model_dir, args.threads)
    import torch
    from transformers import AutoConfig

    n_params = sum(
        p.numel()
        for p in __import__("safetensors.torch", fromlist=["load_file"])
        .load_file(str(model_dir / "model.safetensors"))
        .values()
    )
    thr = runtime["32"]["tokens_per_s"] / bl["32"]["tokens_per_s"]
    lat = runtime["32"]["latency_ms_p50"] / bl["1"]["latency_ms_p50"]
    result = {
        "machine": {
            "device": "cpu",
            "gpu": None,
            "note": "CPU only: no GPU machine is lent to this task",
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "model": {
            "size": args.size,
            "parameters": n_params,
            "config": AutoConfig.from_pretrained(model_dir).to_dict().get("hidden_size"),
        },
        "config": {
            "max_tokens": MAX_TOKENS,
            "torch_threads": args.threads,
            "max_batch_size": cfg.max_batch_size,
            "max_queue_delay_us": cfg.max_queue_delay_us,
            "requests_per_conversation": per_conv,
            "runtime_path": "HTTP chat API, stream=true (SSE) -> gRPC -> Triton chat_stream",
            "baseline_path": "in-process model.generate(), one request at a time (FIFO)",
        },
        "runtime": runtime,
        "baseline": bl,
        "multiturn": mt,
        "multiturn_small_model": mt_small,
        "precision": precision,
        "goals": {
            "throughput_ratio_32": round(thr, 2),
            "throughput_ratio_32_vs_best_baseline": round(
                runtime["32"]["tokens_per_s"] / max(v["tokens_per_s"] for v in bl.values()), 2
            ),
            "throughput_met": thr >= 10,
            "latency_ratio_32_vs_baseline_1": round(lat, 2),
            "latency_met": lat <= 1.5,
            "prefix_ratio": mt["ratio"],
            "prefix_met": mt["ratio"] <= 0.5,
            "prefix_ratio_small": mt_small["ratio"] if mt_small else None,
            "prefix_met_small": bool(mt_small and mt_small["ratio"] <= 0.5),
        },
    }
    (out / "runtime.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "runtime.png")
    print()
    print(table(result))
    print(f"\nwrote {out / 'runtime.json'} and {out / 'runtime.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
