"""Runtime benchmark: the chat runtime beside the engines a team would otherwise pick, same model, same CPU.

Systems (``--systems``), all on one model and the same requests, torch and llama.cpp on the same threads:
- runtime: Redis + the real tritonserver (in-flight batching, ``max_batch_size`` 32) + the chat API,
  driven over HTTP (``/v1/chat/completions``, SSE when streamed); requests past the 32 rows wait for one
  as long as they need (``admission_wait_ms`` ``ADMISSION_WAIT_MS``, 10 minutes, as llama-server queues
  past its 32 slots), not the product's default 10 s before a 429: at 64 conversations the benchmark
  measures the queue, not the refusal;
- llama: llama.cpp's ``llama-server`` (``-np`` 32 slots, ``-cb`` continuous batching) on the model converted to
  GGUF q8_0 by llama.cpp's converter, driven over its OpenAI endpoint by the same client code
  (``engine_peers.LlamaServer``; built from llama-cpp-python's source package by hack/build-llama-server.sh);
- hfcb: transformers' own continuous batching with a paged cache (``ContinuousBatchingManager``), in process;
- static: ``model.generate()`` in static batches of up to 32 within 10 ms (``generate_baseline.StaticBatcher``),
  the floor; serial (not by default): the same one request at a time.

Model (default): a random model with Qwen2-0.5B-Instruct's configuration cut to ``SHAPED_LAYERS`` of its 24
decoder layers (``chatfleet_platform.localruntime.shaped``); ``--models tiny`` adds the tests' tiny model.

Traffic: closed loop at 1/8/32 concurrent conversations, 64 with ``--levels`` (each client sends the next
request of a shared list when its last is answered). Request k asks for ``answer_length(k)`` tokens (mixed: lognormal, median
cap/4), is streamed when (k + k // 8) is even (half the requests) and carries about 1,000 tokens of earlier
history (a distinct conversation) when k % 8 == 7 (one in eight). Two passes: sampled (temperature 0.7,
top-p 0.9, top-k off) and greedy. EOS is suppressed everywhere so lengths are exact (checked:
``length_mismatches``): the runtime gets ``logit_bias`` -100 on EOS, llama-server ``ignore_eos: true``
(it biases every end-of-generation token away) and the same ``logit_bias`` (this EOS is not one), transformers ``eos_token_id=-1``, ``generate()``
``suppress_tokens``.

Figures per pass, level and system: tokens/s over the level's wall time, TTFT p50/p99 and inter-token
latency p50/p99 (streamed requests), whole-response latency p50/p99 (all), RSS of the serving process tree
sampled every 0.5 s (the runtime: tritonserver with its Python stub and the chat API; llama-server; the
in-process peers: the benchmark's own process). Goals at 32 concurrent: tokens/s >= 1.0x the best peer at
an equal or better p99 TTFT, and >= 3x the old engine's 70 tok/s. Then multi-turn (prefix reuse vs
recompute on the runtime) and precision (int8 vs fp32, tiny model, in process).

``--soak SECONDS``: only the runtime, >= 20 overlapping streamed and non-streamed chats for that long; RSS
of the model processes first vs last quarter (goal <= 1.1x), tokens/s last vs first quarter (goal >= 0.9x).

Counts (environment): SHAPED_LAYERS (8), MAX_TOKENS (128), REQUESTS_SHAPED ("3,2,2,1": requests per client at
1, 8, 32 and 64, so 3, 16, 64 and 64; 37 min for both passes at 1/8/32 on 2 shared cores),
REQUESTS_TINY ("8,4,3,2"), SERIAL_REQUESTS_SHAPED ("3,1,1,1"), MULTITURN_REPS (6, tiny),
MULTITURN_REPS_SHAPED (4), SOAK_CLIENTS (24).
Writes bench-results/runtime.json and runtime.png (soak: runtime-soak.json). CPU only.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
from engine_peers import HfContinuousBatcher, LlamaServer, RssSampler, gguf_model  # noqa: E402
from generate_baseline import StaticBatcher, closed_loop  # noqa: E402
from serving_stats import goals, inter_token_gaps, memory_summary, quarter_means, quarters, ratio, summarize  # noqa: E402


def _levels(name: str, default: str) -> tuple[int, ...]:
    """A comma-separated environment setting of one count per concurrency level, e.g. "3,2,2,1"."""
    return tuple(int(x) for x in os.environ.get(name, default).split(","))


CONCURRENCY = (1, 8, 32, 64)
#: The runtime's max batch size; the static batcher's and llama-server's slots too.
MAX_BATCH = 32
#: How long a request past the runtime's MAX_BATCH rows may wait for one (ms): long enough never to be
#: refused at 64 conversations, as llama-server queues past its slots (the product's default is 10 s).
ADMISSION_WAIT_MS = 600_000
#: Decoder layers of the shaped model (docs/benchmarks.md: why 8).
SHAPED_LAYERS = int(os.environ.get("SHAPED_LAYERS", "8"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "128"))
MULTITURN_REPS = {
    "tiny": int(os.environ.get("MULTITURN_REPS", "6")),
    "shaped": int(os.environ.get("MULTITURN_REPS_SHAPED", "4")),
}
#: Requests per concurrent client at each level of CONCURRENCY, per model and system.
REQUESTS = {
    "tiny": {"runtime": _levels("REQUESTS_TINY", "8,4,3,2")},
    "shaped": {
        "runtime": _levels("REQUESTS_SHAPED", "3,2,2,1"),
        "serial": _levels("SERIAL_REQUESTS_SHAPED", "3,1,1,1"),
    },
}
SYSTEMS = ("runtime", "llama", "hfcb", "static", "serial")
PEERS = ("llama", "hfcb", "static", "serial")
LABELS = {
    "runtime": "runtime",
    "llama": "llama-server",
    "hfcb": "transformers CB",
    "static": "static generate",
    "serial": "one at a time",
}
PRECISION = {
    "runtime": "fp32 (precision auto: no AMX-BF16/AVX512-BF16 here)",
    "llama": "GGUF q8_0 weights, f16 KV cache",
    "hfcb": "fp32",
    "static": "fp32",
    "serial": "fp32",
}
#: The two passes: realistic sampling and greedy.
PASSES = {"sampled": {"temperature": 0.7, "top_p": 0.9}, "greedy": {"temperature": 0.0, "top_p": 1.0}}
#: One request in LONG_EVERY carries about HISTORY_TOKENS tokens of earlier conversation.
LONG_EVERY = 8
HISTORY_TOKENS = 1000
#: The old engine's tokens/s at 32 concurrent on the shaped model (docs/benchmarks.md, 2026-11-26).
OLD_ENGINE_TOK_S = 70.0
#: The model name every served system answers to (the runtime's CHATFLEET_MODEL_NAME, llama-server's alias).
SERVED_NAME = "bench-model"
SOAK_CLIENTS = int(os.environ.get("SOAK_CLIENTS", "24"))


def requests_at(model: str, system: str, concurrency: int, quick: bool) -> int:
    """Requests at one level: per client x clients, e.g. 2 x 32 = 64 (every system gets the runtime's)."""
    if quick:
        return 2 if concurrency == 1 else concurrency
    counts = REQUESTS[model].get(system, REQUESTS[model]["runtime"])
    per_client = counts[CONCURRENCY.index(concurrency)] if concurrency in CONCURRENCY else counts[-1]
    return per_client * concurrency


def streamed(request: int) -> bool:
    """Half the requests stream, the long-history ones alternately, e.g. 0 -> True, 1 -> False, 7 -> False, 15 -> True."""
    return (request + request // LONG_EVERY) % 2 == 0


def long_history(request: int) -> bool:
    """One request in LONG_EVERY carries a long earlier conversation, e.g. 7 and 15."""
    return request % LONG_EVERY == LONG_EVERY - 1


def history_filler(tokenizer, tokens: int = HISTORY_TOKENS) -> str:
    """Text of about `tokens` tokens (numbered facts), grown until the tokenizer says so."""
    sentences: list[str] = []
    while len(tokenizer(" ".join(sentences), add_special_tokens=False)["input_ids"]) < tokens - 40:
        sentences.append(f"Fact {len(sentences)}: the cluster has {len(sentences) * 7} pods.")
    return " ".join(sentences)


def conversation(request: int, filler: str, tag: str = "") -> list[dict[str, str]]:
    """Request k's messages: a short question, or (one in eight) a question after a long conversation.

    The run's tag (pass and level) and the request number lead the first message, so no system reuses a
    prefix of another request, of an earlier level or of the warm-up (llama-server's slots keep theirs).
    """
    question = {"role": "user", "content": f"Question {tag}{request}: how do pods scale on Kubernetes?"}
    if not long_history(request):
        return [question]
    return [
        {"role": "user", "content": f"[conversation {tag}{request}] Remember this: {filler}"},
        {"role": "assistant", "content": "Noted: I will keep those facts in mind."},
        question,
    ]


def prompt_for(request: int) -> list[dict[str, str]]:
    """A distinct short user message per request (warm-ups, the precision row)."""
    return [{"role": "user", "content": f"Question {request}: how do pods scale on Kubernetes?"}]


# ---- the systems behind an OpenAI endpoint: the runtime and llama-server ---------------------------------


def request_body(system: str, k: int, filler: str, eos_id: int, sampling: dict, tag: str = "") -> dict:
    """The chat request for request k: its messages, exact length, sampling, EOS suppression per system."""
    body: dict = {
        "model": SERVED_NAME,
        "messages": conversation(k, filler, tag),
        "max_tokens": answer_length(k, MAX_TOKENS),
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "stream": streamed(k),
    }
    if system == "llama":
        # llama-server's own fields: EOS off, its default top-k 40 and min-p 0.05 off (the others have neither).
        # ignore_eos biases away the tokens llama.cpp ends generation on; this tokenizer's EOS is not among
        # them (llama.cpp warns so at load), so it is biased away by id as well.
        body |= {"ignore_eos": True, "top_k": 0, "min_p": 0.0}
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
    body["logit_bias"] = {str(eos_id): -100}
    return body


async def api_request(client, url: str, body: dict) -> dict:
    """One chat request over HTTP; its sample (TTFT and inter-token gaps when streamed)."""
    t0 = time.perf_counter()
    times: list[float] = []
    tokens = 0
    async with client.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        if body["stream"]:
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if (event.get("chatfleet") or {}).get("fallback"):
                    raise RuntimeError(f"fallback answer during the benchmark: {event['chatfleet']}")
                choices = event.get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    times.append(time.perf_counter())
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
            tokens = tokens or len(times)
        else:
            reply = await resp.json()
            if (reply.get("chatfleet") or {}).get("fallback"):
                raise RuntimeError(f"fallback answer during the benchmark: {reply['chatfleet']}")
            tokens = reply["usage"]["completion_tokens"]
    end = time.perf_counter()
    sample = {"tokens": tokens, "asked": body["max_tokens"], "latency": end - t0, "stream": body["stream"]}
    if body["stream"]:
        sample |= {"ttft": (times[0] if times else end) - t0, "gaps": inter_token_gaps(times)}
    return sample


async def api_level(
    url: str,
    system: str,
    concurrency: int,
    requests: int,
    filler: str,
    eos_id: int,
    sampling: dict,
    tag: str = "",
) -> tuple[list[dict], float]:
    """Closed loop over HTTP: `concurrency` clients working through `requests` requests (as closed_loop).

    The load generator uses aiohttp (C-accelerated HTTP parsing): it shares the two CPUs with the server.
    A connection per request (``force_close``): llama-server ends a stream by closing its connection,
    which a pooled client would try to reuse; every system is driven alike.
    """
    import aiohttp

    samples: list[dict] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 4, force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=1800)
    ) as client:
        taken = iter(range(requests))

        async def user() -> None:
            for k in taken:  # shared by every client: each takes the next request when its last is answered
                samples.append(
                    await api_request(client, url, request_body(system, k, filler, eos_id, sampling, tag))
                )

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return samples, wall


# ---- multi-turn: prefix reuse vs recompute on the runtime ---------------------------------------------


def multiturn(triton_grpc: str, tokenizer, reps: int, max_tokens: int = 16) -> dict:
    """Second turn at ~1,000 tokens of history, streamed: prefix reuse (session) vs recompute.

    Both variants send the same messages to Triton's chat model; "recompute" only adds
    ``prefix_cache: false``. Every answer is `max_tokens` long (EOS biased away). Reports time to first
    token and whole-response latency (p50).
    """
    import numpy as np
    import tritonclient.grpc as grpcclient
    from chatfleet_contract.tritonconfig import MODEL_NAME

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
        client.async_stream_infer(MODEL_NAME, [a, b])
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


# ---- one model: every system side by side ------------------------------------------------------------


def precision_of(system: str, args) -> str:
    """What a system serves in: the runtime's from its ``precision`` parameter when ``--runtime-param`` sets it."""
    chosen = runtime_parameters(args).get("precision")
    if system == "runtime" and chosen:
        return f"{chosen} (--runtime-param precision={chosen})"
    return PRECISION[system]


def runtime_parameters(args) -> dict[str, str]:
    """The runtime's model parameters set by the benchmark: its admission wait, then ``--runtime-param``."""
    return {"admission_wait_ms": str(ADMISSION_WAIT_MS), **dict(args.runtime_param)}


def runtime_config(model_dir: Path, args):
    """The runtime's model config for a run: the benchmark's batch cap, queue delay, answer cap, threads and
    admission wait (``--runtime-param`` overrides)."""
    return model_config(
        model_dir,
        max_batch_size=MAX_BATCH,
        max_queue_delay_us=args.queue_delay_us,
        max_new_tokens=max(256, MAX_TOKENS),
        torch_threads=args.threads,
        extra_parameters=runtime_parameters(args),
    )


def load_baseline_model(model_dir: Path):
    """The model and tokenizer for the in-process peers, loaded as the runtime loads them (fp32, CPU)."""
    from chatfleet_runtime.engine.loading import choose_placement, load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    return load_model(model_dir, choose_placement("fp32", "KIND_CPU", cuda_available=False)), tokenizer


def in_process_level(
    engine, system: str, concurrency: int, requests: int, filler: str, tag: str = ""
) -> tuple[list[dict], float]:
    """Closed loop over an in-process peer (threads); non-streamed requests keep only their latency."""

    def submit(k: int) -> dict:
        length, stream = answer_length(k, MAX_TOKENS), streamed(k)
        if system == "hfcb":
            return engine.submit_and_wait(conversation(k, filler, tag), length, stream)
        sample = engine.submit_and_wait(conversation(k, filler, tag), length)
        sample |= {"stream": stream, "asked": length}
        return sample

    return closed_loop(submit, concurrency, requests)


def in_process_engines(systems: list[str], models: dict, tokenizer, args, sampling: dict) -> dict:
    """The in-process peers of one pass (transformers CB on its own copy of the model: it switches attention)."""
    engines: dict = {}
    window_s = args.queue_delay_us / 1e6
    if "hfcb" in systems:
        engines["hfcb"] = HfContinuousBatcher(
            models["hfcb"], tokenizer, threads=args.threads, max_batch=MAX_BATCH, sampling=sampling
        )
    if "static" in systems:
        engines["static"] = StaticBatcher(
            models["static"],
            tokenizer,
            threads=args.threads,
            max_batch=MAX_BATCH,
            window_s=window_s,
            sampling=sampling,
        )
    if "serial" in systems:
        engines["serial"] = StaticBatcher(
            models["static"], tokenizer, threads=args.threads, max_batch=1, window_s=0.0, sampling=sampling
        )
    for system, engine in engines.items():  # warm-up: four short requests
        if system == "hfcb":
            closed_loop(lambda k, e=engine: e.submit_and_wait(prompt_for(k), 8, k % 2 == 0), 4, 4)
        else:
            closed_loop(lambda k, e=engine: e.submit_and_wait(prompt_for(k), 8), 4, 4)
    return engines


def run_model(name: str, model_dir: Path, args, passes: dict[str, tuple[int, ...]]) -> dict:
    """Start the served systems on `model_dir`, then per pass and level run every system in turn.

    Systems take turns at each level (runtime, llama-server, transformers CB, static) so machine noise hits
    them alike; each level's RSS series is sampled while that system runs it.
    """
    import contextlib

    systems = args.systems
    static_model, tokenizer = load_baseline_model(model_dir)
    models = {"static": static_model}
    if "hfcb" in systems:
        models["hfcb"] = load_baseline_model(model_dir)[0]
    eos = tokenizer.eos_token_id
    filler = history_filler(tokenizer)
    text = tokenizer.apply_chat_template(
        conversation(LONG_EVERY - 1, filler), tokenize=False, add_generation_prompt=True
    )
    history_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    cfg = runtime_config(model_dir, args)
    figures = {p: {s: {} for s in systems} for p in passes}
    memory = {p: {s: [] for s in systems} for p in passes}
    counts = {s: {} for s in systems}
    notes: dict[str, str] = {}
    mt = None
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        pids: dict[str, list[int]] = {s: [os.getpid()] for s in systems}
        if "runtime" in systems:
            # The deadline is the API's; a long answer in a batch of 32 on the shaped model needs more than 30 s.
            rt = stack.enter_context(
                local_runtime(
                    Path(args.workdir) / f"rt-{name}",
                    model_dir=model_dir,
                    config=cfg,
                    api_env={
                        "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "1800",
                        "CHATFLEET_MODEL_NAME": SERVED_NAME,
                    },
                )
            )
            urls["runtime"], pids["runtime"] = rt.api_url, [rt.triton.proc.pid, rt.api.proc.pid]
        if "llama" in systems:
            print(f"  {name}: GGUF q8_0 (llama.cpp's converter, cached) and llama-server ...", flush=True)
            gguf = gguf_model(model_dir, "q8_0")
            server = stack.enter_context(
                LlamaServer(
                    gguf,
                    slots=MAX_BATCH,
                    threads=args.threads,
                    ctx_per_slot=2048,
                    log_path=Path(args.workdir) / f"llama-{name}.log",
                )
            )
            urls["llama"], pids["llama"] = server.url, [server.proc.pid]
            notes["llama"] = " ".join(server.command()[1:]).replace(str(gguf), gguf.name)
        for system, url in urls.items():  # warm-up: four short requests
            asyncio.run(api_level(url, system, 4, 4, filler, eos, PASSES["greedy"], "warm-up/"))
        for pass_name, levels in passes.items():
            sampling = PASSES[pass_name]
            engines = in_process_engines(systems, models, tokenizer, args, sampling)
            try:
                for c in levels:
                    for system in systems:
                        n = requests_at(name, system, c, args.quick)
                        tag = f"{pass_name}-{c}/"  # distinct prompts per pass and level
                        with RssSampler(pids[system]) as mem:
                            if system in urls:
                                samples, wall = asyncio.run(
                                    api_level(urls[system], system, c, n, filler, eos, sampling, tag)
                                )
                            else:
                                samples, wall = in_process_level(engines[system], system, c, n, filler, tag)
                        fig = summarize(samples, wall) | memory_summary(mem.series)
                        figures[pass_name][system][str(c)] = fig
                        memory[pass_name][system].append({"level": c, "series": mem.series})
                        counts[system][str(c)] = n
                        print(
                            f"  {name:<6} {pass_name:<7} c={c:<2} {LABELS[system]:<15} "
                            f"{fig['tokens_per_s']:7.1f} tok/s TTFT p99 {fig['ttft_ms_p99']:8.0f} ms "
                            f"ITL p99 {fig['itl_ms_p99']:6.0f} ms RSS peak {fig['rss_mib_peak']:7.0f} MiB "
                            f"({fig['requests']} req, {fig.get('length_mismatches', 0)} length mismatches)",
                            flush=True,
                        )
            finally:
                for engine in engines.values():
                    engine.close()
        if "runtime" in systems and args.multiturn:
            print(f"  {name}: multi-turn, prefix reuse vs recompute ...", flush=True)
            mt = multiturn(rt.triton.grpc_url, tokenizer, reps=2 if args.quick else MULTITURN_REPS[name])
            print(f"  {mt}", flush=True)
    cfg_dict = static_model.config.to_dict()
    peers = [s for s in systems if s in PEERS]
    return {
        "model": {
            "name": name,
            "dir": str(model_dir.relative_to(ROOT)) if model_dir.is_relative_to(ROOT) else str(model_dir),
            "architecture": cfg_dict.get("model_type"),
            "parameters": static_model.num_parameters(),
            "layers": cfg_dict.get("num_hidden_layers"),
            "hidden_size": cfg_dict.get("hidden_size"),
            "intermediate_size": cfg_dict.get("intermediate_size"),
            "attention_heads": cfg_dict.get("num_attention_heads"),
            "kv_heads": cfg_dict.get("num_key_value_heads"),
            "vocab_size": cfg_dict.get("vocab_size"),
            "long_history_prompt_tokens": history_tokens,
        },
        "systems": systems,
        "precision": {s: precision_of(s, args) for s in systems},
        "notes": notes,
        "requests": counts,
        "passes": figures,
        "memory": memory,
        "multiturn": mt,
        "goals": {p: goals(figures[p], peers, old_tok_s=OLD_ENGINE_TOK_S) for p in passes},
    }


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
    """Per model and pass: each level, every system side by side, tokens/s as runtime / that system; goals."""
    cfg = result["config"]
    lengths = cfg["answer_lengths"]
    lines = [
        f"chatfleet runtime benchmark - {result['machine']['device']}, {result['machine']['cpus']} CPUs, "
        f"torch and llama.cpp threads {cfg['threads']}; CPU only.",
        f"answers: lognormal, median {lengths['median_tokens']:g} tokens, cap {lengths['cap_tokens']}, EOS "
        f"suppressed (exact lengths); half streamed; 1 in {LONG_EVERY} with ~{HISTORY_TOKENS} tokens of history",
    ]
    for run in result["models"].values():
        lines += ["", model_line(run["model"])]
        lines += [f"  {LABELS[s]}: {p}" for s, p in run["precision"].items()]
        for pass_name, figures in run["passes"].items():
            sampling = PASSES[pass_name]
            lines += [
                "",
                f"{pass_name} (temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}):",
                f"{'conc':>4} | {'system':<15} {'req':>4} | {'tok/s':>7} {'rt/this':>7} | {'TTFT p50':>8} "
                f"{'p99':>8} | {'ITL p50':>7} {'p99':>7} | {'lat p99':>8} | {'RSS peak':>9}",
            ]
            levels = sorted({int(c) for f in figures.values() for c in f})
            for c in levels:
                rt = figures.get("runtime", {}).get(str(c))
                for i, (system, f) in enumerate(
                    (s, figures[s][str(c)]) for s in figures if str(c) in figures[s]
                ):
                    rel = (
                        f"{rt['tokens_per_s'] / f['tokens_per_s']:6.2f}x"
                        if rt and f["tokens_per_s"]
                        else "      -"
                    )
                    lines.append(
                        f"{c if i == 0 else '':>4} | {LABELS[system]:<15} {f['requests']:>4} | "
                        f"{f['tokens_per_s']:>7.1f} {rel} | {f['ttft_ms_p50']:>6.0f}ms {f['ttft_ms_p99']:>6.0f}ms | "
                        f"{f['itl_ms_p50']:>5.0f}ms {f['itl_ms_p99']:>5.0f}ms | {f['latency_ms_p99'] / 1000:>7.1f}s | "
                        f"{f['rss_mib_peak']:>6.0f}MiB"
                    )
            lines += goal_lines(run["goals"][pass_name])
        mt = run.get("multiturn")
        if mt:
            lines.append(
                f"second turn at {mt['history_tokens']} tokens of history (p50 of {mt['repetitions']}, "
                f"{mt['max_tokens']} new tokens): prefix reuse {mt['reuse_ms_p50']:.0f}ms vs recompute "
                f"{mt['recompute_ms_p50']:.0f}ms = {mt['ratio']:.2f}x (goal <= 0.5x: "
                f"{'met' if mt['ratio'] <= 0.5 else 'NOT MET'}); TTFT {mt['reuse_ttft_ms_p50']:.0f}ms vs "
                f"{mt['recompute_ttft_ms_p50']:.0f}ms = {mt['ttft_ratio']:.2f}x"
            )
    if result.get("precision"):
        lines += ["", *precision_table(result["precision"])]
    return "\n".join(lines)


def goal_lines(g: dict) -> list[str]:
    """The issue's goals at one level in words: "met" or the gap."""
    c = g["level"]
    if "runtime_tok_s" not in g:
        return [f"goals at {c}: not measured (no runtime figures at {c} concurrent)"]
    lines = []
    if "best_peer" in g:
        thr, ttft = g["throughput_vs_best"], g["ttft_p99_vs_best"]
        lines.append(
            f"goal at {c}: tokens/s >= 1.0x the best peer ({LABELS[g['best_peer']]}, {g['best_peer_tok_s']:.1f}): "
            f"{thr:.2f}x: {'met' if g['throughput_met'] else f'NOT MET (gap {1 - thr:.2f}x)'}; at p99 TTFT <= its: "
            f"{ttft:.2f}x: {'met' if g['ttft_met'] else f'NOT MET ({ttft:.2f}x its p99)'}"
        )
    lines.append(
        f"goal at {c}: tokens/s >= 3x the old engine's {g['old_engine_tok_s']:g} = {g['target_tok_s']:g}: "
        f"{g['runtime_tok_s']:.1f} ({g['old_engine_ratio']:.2f}x): "
        + ("met" if g["old_engine_met"] else f"NOT MET (gap {g['old_engine_gap_tok_s']:.1f} tok/s)")
    )
    return lines


STYLES = {
    "runtime": ("o-", "tab:blue"),
    "llama": ("D-", "tab:red"),
    "hfcb": ("v-", "tab:purple"),
    "static": ("s--", "tab:orange"),
    "serial": ("^:", "tab:green"),
}


def plot(result: dict, path: Path) -> None:
    """PNG, a row per model and pass: tokens/s, TTFT p99, ITL p99 against concurrency; RSS over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(name, p, run) for name, run in result["models"].items() for p in run["passes"]]
    fig, axes = plt.subplots(len(rows), 4, figsize=(20, 4.2 * len(rows)), squeeze=False)
    for row, (name, pass_name, run) in zip(axes, rows, strict=True):
        figures = run["passes"][pass_name]
        for system, data in figures.items():
            style, color = STYLES[system]
            xs = sorted(int(c) for c in data)
            row[0].plot(
                xs, [data[str(c)]["tokens_per_s"] for c in xs], style, color=color, label=LABELS[system]
            )
            for col, metric in ((1, "ttft"), (2, "itl")):
                for q, alpha in (("p99", 1.0), ("p50", 0.35)):
                    values = [data[str(c)][f"{metric}_ms_{q}"] for c in xs]
                    row[col].plot(xs, values, style, color=color, alpha=alpha, label=f"{LABELS[system]} {q}")
            offset, ts, ms = 0.0, [], []
            for level in run["memory"][pass_name][system]:
                ts += [offset + t for t, _ in level["series"]]
                ms += [m for _, m in level["series"]]
                offset = ts[-1] if ts else offset
            row[3].plot(ts, ms, "-", color=color, label=LABELS[system])
        for ax, title, unit in (
            (row[0], "throughput", "tokens/s"),
            (row[1], "time to first token (streamed)", "ms"),
            (row[2], "inter-token latency (streamed)", "ms"),
        ):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent conversations")
            ax.set_ylabel(unit)
            ax.set_title(f"{name}, {pass_name}: {title}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        row[1].set_yscale("log")
        row[3].set_title(f"{name}, {pass_name}: RSS of the serving processes")
        row[3].set_xlabel("seconds of that system's runs")
        row[3].set_ylabel("MiB")
        row[3].grid(alpha=0.3)
        row[3].legend(fontsize=7)
    fig.suptitle(
        "chatfleet runtime vs llama-server, transformers continuous batching, static generate() - CPU only"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- soak: the runtime for a long while ------------------------------------------------------------------


def soak(model_dir: Path, args, seconds: float, out: Path) -> dict:
    """SOAK_CLIENTS closed-loop chats (half streamed, 1 in 8 long) against the runtime for `seconds`.

    Tokens are counted at each request's end; RSS of tritonserver (with its Python stub) and the chat API
    every 0.5 s. Goals: RSS last quarter <= 1.1x the first, tokens/s last quarter >= 0.9x the first.
    """
    from chatfleet_runtime.engine.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    filler = history_filler(tokenizer)
    eos = tokenizer.eos_token_id
    cfg = runtime_config(model_dir, args)
    done: list[tuple[float, int]] = []
    sampling = PASSES["sampled"]

    async def drive(url: str, t0: float) -> None:
        import aiohttp

        counter = itertools.count()
        connector = aiohttp.TCPConnector(limit=SOAK_CLIENTS + 4, force_close=True)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=1800)
        ) as client:

            async def user() -> None:
                while time.perf_counter() - t0 < seconds:
                    k = next(counter)
                    sample = await api_request(client, url, request_body("runtime", k, filler, eos, sampling))
                    done.append((time.perf_counter() - t0, sample["tokens"]))

            await asyncio.gather(*(user() for _ in range(SOAK_CLIENTS)))

    with local_runtime(
        Path(args.workdir) / "rt-soak",
        model_dir=model_dir,
        config=cfg,
        api_env={"CHATFLEET_REQUEST_TIMEOUT_SECONDS": "1800", "CHATFLEET_MODEL_NAME": SERVED_NAME},
    ) as rt:
        asyncio.run(api_level(rt.api_url, "runtime", 4, 4, filler, eos, sampling))  # warm-up
        with RssSampler([rt.triton.proc.pid, rt.api.proc.pid]) as mem:
            t0 = time.perf_counter()
            asyncio.run(drive(rt.api_url, t0))
    tok_first, tok_last = quarters(done, seconds)
    mem_first, mem_last = quarter_means(mem.series, seconds)
    result = {
        "seconds": seconds,
        "clients": SOAK_CLIENTS,
        "requests": len(done),
        "tokens": sum(n for _, n in done),
        "tokens_per_s_first_quarter": round(tok_first, 1),
        "tokens_per_s_last_quarter": round(tok_last, 1),
        "tokens_per_s_ratio": ratio(tok_last, tok_first),
        "rss_mib_first_quarter": round(mem_first, 1),
        "rss_mib_last_quarter": round(mem_last, 1),
        "rss_ratio": ratio(mem_last, mem_first),
        "rss_series": mem.series,
    }
    result["tokens_met"] = (result["tokens_per_s_ratio"] or 0) >= 0.9
    result["rss_met"] = result["rss_ratio"] is not None and result["rss_ratio"] <= 1.1
    (out / "runtime-soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"soak {seconds:g} s, {SOAK_CLIENTS} chats, {len(done)} requests: tokens/s {tok_first:.1f} first quarter, "
        f"{tok_last:.1f} last ({result['tokens_per_s_ratio']}x; goal >= 0.9x: "
        f"{'met' if result['tokens_met'] else 'NOT MET'}); RSS {mem_first:.0f} MiB first quarter, {mem_last:.0f} MiB "
        f"last ({result['rss_ratio']}x; goal <= 1.1x: {'met' if result['rss_met'] else 'NOT MET'})"
    )
    print(f"wrote {out / 'runtime-soak.json'}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Run every system on each model, write the JSON and PNG, print the tables (or the soak)."""
    global MAX_TOKENS, SHAPED_LAYERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="shaped", help="comma-separated: shaped, tiny")
    parser.add_argument(
        "--systems", default="runtime,llama,hfcb,static", help=f"comma-separated, of {','.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--layers", type=int, default=SHAPED_LAYERS, help="decoder layers of the shaped model"
    )
    parser.add_argument(
        "--levels",
        default="1,8,32",
        help="levels, sampled pass (64 too: --levels 1,8,32,64; about as long again as the 32 level)",
    )
    parser.add_argument("--greedy-levels", default="1,8,32", help="levels, greedy pass ('' skips it)")
    parser.add_argument("--workdir", default=str(ROOT / ".work" / "bench-runtime"))
    parser.add_argument("--out", default=str(ROOT / "bench-results"))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch and llama.cpp threads, every system (1: the 2-core default)",
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
    parser.add_argument(
        "--no-multiturn", dest="multiturn", action="store_false", help="skip the multi-turn row"
    )
    parser.add_argument("--no-precision", dest="precision", action="store_false", help="skip the int8 row")
    parser.add_argument("--precision-only", action="store_true", help="only the int8 vs fp32 row (seconds)")
    parser.add_argument(
        "--runtime-param",
        action="append",
        default=[],
        type=lambda text: tuple(text.split("=", 1)),
        metavar="NAME=VALUE",
        help="a chat model parameter for the runtime (repeatable), e.g. prefill_chunk_tokens=512",
    )
    parser.add_argument(
        "--soak", type=float, metavar="SECONDS", help="only the soak of the runtime, this long"
    )
    args = parser.parse_args(argv)
    MAX_TOKENS, SHAPED_LAYERS = args.max_tokens, args.layers
    args.systems = [s for s in args.systems.split(",") if s]
    if unknown := set(args.systems) - set(SYSTEMS):
        parser.error(f"--systems: unknown {sorted(unknown)} ({', '.join(SYSTEMS)})")
    workdir, out = Path(args.workdir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny_dir = tiny_model(workdir, size="tiny")
    if args.precision_only:
        print("\n".join(precision_table(precision_rows(tiny_dir, args.threads))))
        return 0

    def shaped_dir() -> Path:
        from chatfleet_platform.localruntime.shaped import build_shaped_model

        print(f"the shaped model (Qwen2-0.5B's configuration, {SHAPED_LAYERS} layers) ...", flush=True)
        return build_shaped_model(workdir / f"shaped-{SHAPED_LAYERS}-model", layers=SHAPED_LAYERS)

    if args.soak:
        soak(shaped_dir(), args, args.soak, out)
        return 0
    passes = {"sampled": tuple(int(c) for c in args.levels.split(",") if c)}
    if args.greedy_levels:
        passes["greedy"] = tuple(int(c) for c in args.greedy_levels.split(",") if c)
    import torch

    started = time.perf_counter()
    runs: dict[str, dict] = {}
    for name in args.models.split(","):
        if name not in ("tiny", "shaped"):
            parser.error(f"--models: unknown model {name!r} (shaped, tiny)")
        model_dir = tiny_dir if name == "tiny" else shaped_dir()
        print(f"{name} model: {', '.join(LABELS[s] for s in args.systems)}; passes {passes} ...", flush=True)
        runs[name] = run_model(name, model_dir, args, passes)
    precision = None
    if args.precision:
        print("precision: int8 vs fp32 (tiny model) ...", flush=True)
        precision = precision_rows(tiny_dir, args.threads)
    result = {
        "machine": {
            "device": "cpu",
            "gpu": None,
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "llama_cpp_python_source": engine_peers_version(),
        },
        "config": {
            "answer_lengths": describe(MAX_TOKENS),
            "threads": args.threads,
            "max_batch_size": MAX_BATCH,
            "max_queue_delay_us": args.queue_delay_us,
            "static_window_ms": args.queue_delay_us / 1000,
            "quick": args.quick,
            "runtime_parameters": runtime_parameters(args),
            "passes": {p: {"levels": list(v), **PASSES[p]} for p, v in passes.items()},
            "streamed": "request k streams when (k + k // 8) is even (half)",
            "long_history": f"request k carries ~{HISTORY_TOKENS} tokens of earlier conversation when k % 8 == 7",
            "eos": "runtime: logit_bias -100 on EOS; llama-server: ignore_eos true; transformers CB: "
            "eos_token_id -1; generate(): suppress_tokens (every special token)",
            "paths": {
                "runtime": "HTTP chat API (SSE when streamed) -> gRPC -> Triton chat (in-flight batching)",
                "llama": "HTTP llama-server /v1/chat/completions (-np 32 slots, -cb), same client code",
                "hfcb": "in process: transformers ContinuousBatchingManager (paged cache), a router thread",
                "static": "in process: model.generate() per static batch (left-padded), run for its longest "
                "answer; a batch is split by prompt length (under/over 256 tokens) so one long history does not "
                "pad every short prompt",
            },
            "memory": "RSS of the serving process tree every 0.5 s; the in-process peers share the benchmark's "
            "process (both in-process model copies and the client threads)",
        },
        "wall_s": round(time.perf_counter() - started, 1),
        "models": runs,
        "precision": precision,
    }
    (out / "runtime.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "runtime.png")
    print()
    print(table(result))
    print(f"\nwrote {out / 'runtime.json'} and {out / 'runtime.png'} ({result['wall_s']:.0f} s)")
    return 0


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo spells it ('' when unreadable), read as the runtime reads it."""
    from chatfleet_runtime.engine.loading import read_cpuinfo

    for line in read_cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def engine_peers_version() -> str:
    """The llama-cpp-python source package the llama-server peer is built from."""
    from engine_peers import llama_version

    return llama_version()


if __name__ == "__main__":
    sys.exit(main())
