"""Runtime benchmark: the chat runtime vs what a transformers user gets without a server, same machine.

Three systems, same model, same requests:
(a) the runtime: Redis + the real tritonserver (in-flight batching) + the chat API, driven over HTTP
    with streaming (server-sent events), like a real client;
(b) static batching: ``model.generate()`` in process, requests collected into batches of up to the
    runtime's max batch size (32) within a window (the runtime's queue delay, 10 ms), left-padded, one
    generate() per batch, run for its longest answer (``generate_baseline.StaticBatcher``);
(c) one at a time: the same with batches of one (one generate() per request, first come first served).

Two models: the tiny test model (about 200k parameters: batching is nearly free) and a random model with
Qwen2-0.5B-Instruct's configuration cut to ``SHAPED_LAYERS`` of its 24 decoder layers
(``chatfleet_platform.localruntime.shaped``). Answers have mixed lengths (``answer_lengths``: the same
draw per request for every system) and exactly those lengths: EOS is suppressed everywhere (the runtime
gets ``logit_bias`` -100 on EOS, which it honours; the baselines ``suppress_tokens``).

At 1, 8 and 32 concurrent clients (closed loop: each client sends the next request of a shared list as
soon as its last one is answered, so that many are in flight until the list drains): tokens per second
over the level's wall time (the drain included), time to first token p50/p99 and whole-response latency
p50/p99, with ratios runtime / each baseline. Multi-turn, per model:
second-turn latency at about 1,000 tokens of history with KV-prefix reuse vs recompute (the same request
to Triton with ``prefix_cache: false``). Precision, tiny model: int8 (dynamic quantisation) vs fp32,
weights memory and batched tokens/s, in process (``--precision-only`` runs just that row).

Counts (environment): SHAPED_LAYERS (8), MAX_TOKENS (128: the answer-length cap), REQUESTS_TINY
("8,4,3": requests per client at 1, 8 and 32 concurrent, so 8, 32 and 96 requests), REQUESTS_SHAPED
("4,3,3"), SERIAL_REQUESTS_SHAPED ("4,1,1": the one-at-a-time baseline on the shaped model, whose
throughput does not depend on the count), MULTITURN_REPS (6, tiny) and MULTITURN_REPS_SHAPED (4).

Writes bench-results/runtime.json and bench-results/runtime.png and prints a table per model.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "hack"))  # this checkout's platform helpers (the shaped model)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, also when loaded by path

from answer_lengths import answer_length, describe  # noqa: E402
from chatfleet_platform.localruntime.testing import local_runtime, model_config, tiny_model  # noqa: E402
from generate_baseline import StaticBatcher, closed_loop  # noqa: E402


def _levels(name: str, default: str) -> tuple[int, ...]:
    """A comma-separated environment setting of one count per concurrency level, e.g. "8,4,3"."""
    return tuple(int(x) for x in os.environ.get(name, default).split(","))


CONCURRENCY = (1, 8, 32)
#: The runtime's max batch size; the static batcher's too (a batch never holds more).
MAX_BATCH = 32
#: Decoder layers of the shaped model: 8 of 24 fit the 20-minute budget on 2 cores (docs/benchmarks.md).
SHAPED_LAYERS = int(os.environ.get("SHAPED_LAYERS", "8"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "128"))
MULTITURN_REPS = {
    "tiny": int(os.environ.get("MULTITURN_REPS", "6")),
    "shaped": int(os.environ.get("MULTITURN_REPS_SHAPED", "4")),
}
#: Requests per concurrent client at each level of CONCURRENCY, per model and system.
REQUESTS = {
    "tiny": {"runtime": _levels("REQUESTS_TINY", "8,4,3")},
    "shaped": {
        "runtime": _levels("REQUESTS_SHAPED", "4,3,3"),
        "serial": _levels("SERIAL_REQUESTS_SHAPED", "4,1,1"),
    },
}
SYSTEMS = ("runtime", "static", "serial")
LABELS = {"runtime": "runtime", "static": "static batched", "serial": "one at a time"}


def requests_at(model: str, system: str, concurrency: int, quick: bool) -> int:
    """Requests at one level: per client x clients, e.g. 3 x 32 = 96 (static batching gets the runtime's)."""
    if quick:
        return 2 if concurrency == 1 else concurrency
    counts = REQUESTS[model].get(system, REQUESTS[model]["runtime"])
    per_client = counts[CONCURRENCY.index(concurrency)] if concurrency in CONCURRENCY else counts[-1]
    return per_client * concurrency


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summarize(samples: list[dict], wall_s: float) -> dict:
    """tokens/s over the wall time, TTFT and latency percentiles in milliseconds (and batch facts)."""
    tokens = sum(s["tokens"] for s in samples)
    ttft = [s["ttft"] * 1000 for s in samples]
    lat = [s["latency"] * 1000 for s in samples]
    out = {
        "requests": len(samples),
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(tokens / wall_s, 1),
        "ttft_ms_p50": round(pct(ttft, 50), 1),
        "ttft_ms_p99": round(pct(ttft, 99), 1),
        "latency_ms_p50": round(pct(lat, 50), 1),
        "latency_ms_p99": round(pct(lat, 99), 1),
    }
    if samples and "batch_end" in samples[0]:
        ends = [s["batch_end"] * 1000 for s in samples]
        out["batch_end_ms_p50"] = round(pct(ends, 50), 1)
        out["batch_end_ms_p99"] = round(pct(ends, 99), 1)
        out["batch_mean"] = round(statistics.mean(s["batch"] for s in samples), 1)
    if samples and "asked" in samples[0]:
        out["length_mismatches"] = sum(s["tokens"] != s["asked"] for s in samples)
    return out


def prompt_for(request: int) -> list[dict[str, str]]:
    """A distinct short user message per request."""
    return [{"role": "user", "content": f"Question {request}: how do pods scale on Kubernetes?"}]


# ---- (a) the runtime ------------------------------------------------------------------------------


async def runtime_level(
    api_url: str, concurrency: int, requests: int, eos_id: int
) -> tuple[list[dict], float]:
    """Closed loop: `concurrency` clients working through `requests` streamed requests (as closed_loop).

    Each request asks for its answer_length with EOS biased away (logit_bias -100), so it gets exactly
    that many tokens (checked: ``length_mismatches``). The load generator uses aiohttp (C-accelerated
    HTTP parsing): it shares the two CPUs with the runtime, so a heavy client would be measured as
    runtime overhead.
    """
    import aiohttp

    samples: list[dict] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as client:
        taken = iter(range(requests))

        async def user() -> None:
            for k in taken:  # shared by every client: each takes the next request when its last is answered
                asked = answer_length(k, MAX_TOKENS)
                body = {
                    "messages": prompt_for(k),
                    "max_tokens": asked,
                    "logit_bias": {str(eos_id): -100},
                    "stream": True,
                }
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
                samples.append(
                    {"ttft": (first or end) - t0, "latency": end - t0, "tokens": tokens, "asked": asked}
                )

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return samples, wall


def multiturn(triton_grpc: str, tokenizer, reps: int, max_tokens: int = 16) -> dict:
    """Second turn at ~1,000 tokens of history, streamed: prefix reuse (session) vs recompute.

    Both variants send the same messages to Triton's chat_stream model; "recompute" only adds
    ``prefix_cache: false``. Every answer is `max_tokens` long (EOS biased away). Reports time to first
    token and whole-response latency (p50).
    """
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(triton_grpc)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    no_eos = {"logit_bias": {str(tokenizer.eos_token_id): -100}}

    def call(messages, params) -> tuple[float, float, str]:
        a = grpcclient.InferInput("MESSAGES", [1, 1], "BYTES")
        a.set_data_from_numpy(np.array([[json.dumps(messages).encode()]], dtype=np.object_))
        b = grpcclient.InferInput("PARAMETERS", [1, 1], "BYTES")
        b.set_data_from_numpy(np.array([[json.dumps({**no_eos, **params}).encode()]], dtype=np.object_))
        t0 = time.perf_counter()
        client.async_stream_infer("chat_stream", [a, b])
        first, parts = None, []
        while True:
            result, error = events.get(timeout=300)
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


# ---- one model: the three systems side by side --------------------------------------------------------


def load_baseline_model(model_dir: Path):
    """The model and tokenizer for the in-process baselines, loaded as the runtime loads them (fp32, CPU)."""
    from chatfleet_runtime.engine.loading import choose_placement, load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    return load_model(model_dir, choose_placement("fp32", "KIND_CPU", cuda_available=False)), tokenizer


def run_model(name: str, model_dir: Path, args, levels: tuple[int, ...]) -> dict:
    """Start the runtime on `model_dir` and measure it beside both baselines at each level, then multi-turn.

    Levels are interleaved (runtime, static batching, one at a time at one level, then the next level) so
    machine noise hits all three alike.
    """
    model, tokenizer = load_baseline_model(model_dir)
    eos = tokenizer.eos_token_id
    cfg = model_config(
        model_dir,
        max_batch_size=MAX_BATCH,
        max_queue_delay_us=args.queue_delay_us,
        max_new_tokens=max(256, MAX_TOKENS),
        torch_threads=args.threads,
    )
    window_s = args.queue_delay_us / 1e6
    baselines = {
        "static": StaticBatcher(
            model, tokenizer, threads=args.threads, max_batch=MAX_BATCH, window_s=window_s
        ),
        "serial": StaticBatcher(model, tokenizer, threads=args.threads, max_batch=1, window_s=0.0),
    }
    figures: dict[str, dict[str, dict]] = {system: {} for system in SYSTEMS}
    counts: dict[str, dict[str, int]] = {system: {} for system in SYSTEMS}
    # The deadline is the API's; a 128-token answer in a batch of 32 on the shaped model needs more than 30 s.
    api_env = {"CHATFLEET_REQUEST_TIMEOUT_SECONDS": "900"}
    try:
        with local_runtime(
            Path(args.workdir) / f"rt-{name}", model_dir=model_dir, config=cfg, api_env=api_env
        ) as rt:
            asyncio.run(runtime_level(rt.api_url, 4, 1, eos))  # warm-up
            closed_loop(lambda k: baselines["static"].submit_and_wait(prompt_for(k), 8), 4, 4)
            for c in levels:
                for system in SYSTEMS:
                    n = requests_at(name, system, c, args.quick)
                    if system == "runtime":
                        samples, wall = asyncio.run(runtime_level(rt.api_url, c, n, eos))
                    else:
                        batcher = baselines[system]

                        def submit(k: int, batcher=batcher) -> dict:
                            return batcher.submit_and_wait(prompt_for(k), answer_length(k, MAX_TOKENS))

                        samples, wall = closed_loop(submit, c, n)
                    figures[system][str(c)] = summarize(samples, wall)
                    counts[system][str(c)] = n
                    print(f"  {name:<6} c={c:<2} {LABELS[system]:<14} {figures[system][str(c)]}", flush=True)
            print(f"  {name}: multi-turn, prefix reuse vs recompute ...", flush=True)
            mt = multiturn(rt.triton.grpc_url, tokenizer, reps=2 if args.quick else MULTITURN_REPS[name])
            print(f"  {mt}", flush=True)
    finally:
        for batcher in baselines.values():
            batcher.close()
    cfg_dict = model.config.to_dict()
    return {
        "model": {
            "name": name,
            "dir": str(model_dir.relative_to(ROOT)) if model_dir.is_relative_to(ROOT) else str(model_dir),
            "architecture": cfg_dict.get("model_type"),
            "parameters": model.num_parameters(),
            "layers": cfg_dict.get("num_hidden_layers"),
            "hidden_size": cfg_dict.get("hidden_size"),
            "intermediate_size": cfg_dict.get("intermediate_size"),
            "attention_heads": cfg_dict.get("num_attention_heads"),
            "kv_heads": cfg_dict.get("num_key_value_heads"),
            "vocab_size": cfg_dict.get("vocab_size"),
        },
        "requests": counts,
        **figures,
        "multiturn": mt,
        "goals": goals(figures, mt),
    }


def ratio(a: float, b: float) -> float | None:
    """a / b rounded, None when b is 0."""
    return round(a / b, 2) if b else None


def goals(figures: dict, mt: dict) -> dict:
    """At 32 concurrent: tokens/s >= 2x static batching at equal or better p99 latency; prefix reuse <= 0.5x."""
    rt, st = figures["runtime"].get("32"), figures["static"].get("32")
    out: dict = {"prefix_ratio": mt["ratio"], "prefix_met": mt["ratio"] <= 0.5}
    if rt and st:
        thr = ratio(rt["tokens_per_s"], st["tokens_per_s"])
        p99 = ratio(rt["latency_ms_p99"], st["latency_ms_p99"])
        out |= {
            "throughput_vs_static_32": thr,
            "p99_latency_vs_static_32": p99,
            "throughput_met": thr is not None and thr >= 2,
            "latency_met": p99 is not None and p99 <= 1,
        }
    return out


# ---- precision: int8 vs fp32 -----------------------------------------------------------------------


def precision_rows(
    model_dir: Path, threads: int, *, batch: int = 8, max_tokens: int = 64, reps: int = 3
) -> dict:
    """int8 vs fp32 on CPU with the production loader and BatchGenerator: weights MiB and tokens/s.

    One greedy batch of `batch` requests, `max_tokens` each, best of `reps` (after a warm-up batch).
    """
    import torch
    from chatfleet_runtime.engine.generation import BatchGenerator
    from chatfleet_runtime.engine.loading import choose_placement, load_model, load_tokenizer, weights_bytes
    from chatfleet_runtime.engine.rows import GenerationRequest
    from chatfleet_runtime.prompting import SamplingParams, render_prompt

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(model_dir)
    prompts = [
        render_prompt(tokenizer, prompt_for(i), max_context_tokens=2048, max_new_tokens=max_tokens).ids
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


def model_line(m: dict) -> str:
    """One line naming a model's shape."""
    return (
        f"{m['name']} model: {m['architecture']}, {m['parameters']:,} parameters, {m['layers']} layers x hidden "
        f"{m['hidden_size']}, MLP {m['intermediate_size']}, {m['attention_heads']}/{m['kv_heads']} heads, "
        f"vocabulary {m['vocab_size']:,}"
    )


def table(result: dict) -> str:
    """Per model: each level, the three systems side by side, tokens/s ratio runtime / that system."""
    cfg = result["config"]
    lengths = cfg["answer_lengths"]
    lines = [
        f"chatfleet runtime benchmark - {result['machine']['device']}, {result['machine']['cpus']} CPUs, "
        f"torch threads {cfg['torch_threads']}; NOTE: CPU only - no GPU machine is lent to this task.",
        f"answers: lognormal, median {lengths['median_tokens']:g} tokens, cap {lengths['cap_tokens']}, "
        f"EOS suppressed (exact lengths); static batches of up to {cfg['max_batch_size']} "
        f"within {cfg['static_window_ms']:g} ms",
    ]
    for run in result["models"].values():
        lines += ["", model_line(run["model"])]
        lines.append(
            f"{'conc':>4} | {'system':<14} {'req':>4} | {'tok/s':>7} {'rt/this':>7} | {'TTFT p50':>9} {'p99':>9} | "
            f"{'lat p50':>9} {'p99':>9}"
        )
        levels = [c for c in CONCURRENCY if str(c) in run["runtime"]] or sorted(
            int(c) for c in run["runtime"]
        )
        for c in levels:
            rt = run["runtime"][str(c)]
            for system in SYSTEMS:
                f = run[system][str(c)]
                lines.append(
                    f"{c if system == 'runtime' else '':>4} | {LABELS[system]:<14} {f['requests']:>4} | "
                    f"{f['tokens_per_s']:>7.1f} {rt['tokens_per_s'] / f['tokens_per_s']:>6.2f}x | "
                    f"{f['ttft_ms_p50']:>7.0f}ms {f['ttft_ms_p99']:>7.0f}ms | "
                    f"{f['latency_ms_p50']:>7.0f}ms {f['latency_ms_p99']:>7.0f}ms"
                )
        g, mt = run["goals"], run["multiturn"]
        if "throughput_vs_static_32" in g:
            lines.append(
                f"goal at 32: tokens/s >= 2x static batching ({g['throughput_vs_static_32']:.2f}x: "
                f"{'MET' if g['throughput_met'] else 'NOT MET'}) at p99 latency <= static's "
                f"({g['p99_latency_vs_static_32']:.2f}x: {'MET' if g['latency_met'] else 'NOT MET'})"
            )
        lines.append(
            f"second turn at {mt['history_tokens']} tokens of history (p50 of {mt['repetitions']}, "
            f"{mt['max_tokens']} new tokens): prefix reuse {mt['reuse_ms_p50']:.0f}ms vs recompute "
            f"{mt['recompute_ms_p50']:.0f}ms = {mt['ratio']:.2f}x (goal <= 0.5x: {'MET' if g['prefix_met'] else 'NOT MET'}); "
            f"TTFT {mt['reuse_ttft_ms_p50']:.0f}ms vs {mt['recompute_ttft_ms_p50']:.0f}ms = {mt['ttft_ratio']:.2f}x"
        )
    if result.get("precision"):
        lines += ["", *precision_table(result["precision"])]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """PNG per model: tokens/s, latency and TTFT against concurrency for each system; multi-turn bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["models"]
    fig, axes = plt.subplots(len(runs), 4, figsize=(19, 4.3 * len(runs)), squeeze=False)
    styles = {"runtime": ("o-", "tab:blue"), "static": ("s--", "tab:orange"), "serial": ("^:", "tab:green")}
    for row, (name, run) in zip(axes, runs.items(), strict=True):
        xs = sorted(int(c) for c in run["runtime"])
        for system in SYSTEMS:
            data, (style, color), label = run[system], styles[system], LABELS[system]
            row[0].plot(xs, [data[str(c)]["tokens_per_s"] for c in xs], style, color=color, label=label)
            for col, metric in ((1, "latency"), (2, "ttft")):
                for q, alpha in (("p99", 1.0), ("p50", 0.4)):
                    values = [data[str(c)][f"{metric}_ms_{q}"] for c in xs]
                    row[col].plot(xs, values, style, color=color, alpha=alpha, label=f"{label} {q}")
        for ax, title, unit in (
            (row[0], "throughput", "tokens/s"),
            (row[1], "whole-response latency", "ms"),
            (row[2], "time to first token", "ms"),
        ):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(unit)
            ax.set_title(f"{name}: {title}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        row[1].set_yscale("log")
        row[2].set_yscale("log")
        mt = run["multiturn"]
        row[3].bar([0, 1], [mt["reuse_ms_p50"], mt["recompute_ms_p50"]], color=["tab:green", "tab:gray"])
        row[3].set_xticks([0, 1], ["prefix reuse", "recompute"])
        row[3].set_title(
            f"{name}: 2nd turn, {mt['history_tokens']} tokens of history (p50)\n"
            f"prefix reuse / recompute = {mt['ratio']:.2f}x"
        )
        row[3].set_ylabel("ms")
    fig.suptitle("chatfleet runtime vs static-batched and one-at-a-time generate() - CPU only (no GPU lent)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run every system on each model, write the JSON and PNG, print the tables."""
    global MAX_TOKENS, SHAPED_LAYERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,shaped", help="comma-separated: tiny, shaped")
    parser.add_argument(
        "--layers", type=int, default=SHAPED_LAYERS, help="decoder layers of the shaped model"
    )
    parser.add_argument("--levels", default=",".join(map(str, CONCURRENCY)), help="concurrency levels")
    parser.add_argument("--workdir", default=str(ROOT / ".work" / "bench-runtime"))
    parser.add_argument("--out", default=str(ROOT / "bench-results"))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads, every system (1 is fastest on a busy 2-core box)",
    )
    parser.add_argument("--quick", action="store_true", help="one request per client, two at 1 (smoke run)")
    parser.add_argument(
        "--queue-delay-us",
        type=int,
        default=10_000,
        help="Triton max_queue_delay_microseconds (the CRD default) and the static batcher's window",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=MAX_TOKENS, help="the answer-length cap (every system)"
    )
    parser.add_argument("--no-precision", dest="precision", action="store_false", help="skip the int8 row")
    parser.add_argument(
        "--precision-only", action="store_true", help="only the int8 vs fp32 row (in process, seconds)"
    )
    args = parser.parse_args(argv)
    MAX_TOKENS, SHAPED_LAYERS = args.max_tokens, args.layers
    workdir, out = Path(args.workdir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny_dir = tiny_model(workdir, size="tiny")
    if args.precision_only:
        print("\n".join(precision_table(precision_rows(tiny_dir, args.threads))))
        return 0
    levels = tuple(int(c) for c in args.levels.split(","))
    import torch

    runs: dict[str, dict] = {}
    for name in args.models.split(","):
        if name == "tiny":
            model_dir = tiny_dir
        elif name == "shaped":
            from chatfleet_platform.localruntime.shaped import build_shaped_model

            print(
                f"building the shaped model (Qwen2-0.5B's configuration, {SHAPED_LAYERS} layers) ...",
                flush=True,
            )
            model_dir = build_shaped_model(workdir / f"shaped-{SHAPED_LAYERS}-model", layers=SHAPED_LAYERS)
        else:
            parser.error(f"--models: unknown model {name!r} (tiny, shaped)")
        print(f"{name} model: runtime, static batching, one at a time at {levels} concurrent ...", flush=True)
        runs[name] = run_model(name, model_dir, args, levels)
    precision = None
    if args.precision:
        print("precision: int8 vs fp32 (tiny model) ...", flush=True)
        precision = precision_rows(tiny_dir, args.threads)
    result = {
        "machine": {
            "device": "cpu",
            "gpu": None,
            "note": "CPU only: no GPU machine is lent to this task",
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "config": {
            "answer_lengths": describe(MAX_TOKENS),
            "torch_threads": args.threads,
            "max_batch_size": MAX_BATCH,
            "max_queue_delay_us": args.queue_delay_us,
            "static_window_ms": args.queue_delay_us / 1000,
            "quick": args.quick,
            "runtime_path": "HTTP chat API, stream=true (SSE) -> gRPC -> Triton chat_stream (in-flight batching)",
            "static_path": "in-process model.generate() per static batch (left-padded), run for its longest answer",
            "serial_path": "in-process model.generate(), one request at a time (FIFO)",
            "latency": "static batching: a row is done at its own last token (as streamed); batch_end_ms is "
            "the end of its batch",
        },
        "models": runs,
        "precision": precision,
    }
    (out / "runtime.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "runtime.png")
    print()
    print(table(result))
    print(f"\nwrote {out / 'runtime.json'} and {out / 'runtime.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
