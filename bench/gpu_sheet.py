"""The GPU sheet: the runtime's engine on one GPU, at 1 to 256+ concurrent conversations, per precision.

Runnable by anyone with an NVIDIA GPU and the runtime package installed (`pip install ./contract
./runtime`); needs nothing from the network.
``make bench-gpu`` (or ``python bench/gpu_sheet.py --out DIR``) builds the models, runs every case it has
time for (``--budget-s``) and writes ``gpu-sheet.json`` (after each case, so a run cut short keeps what it
measured) and ``gpu-sheet.md`` (the tables docs/runtime.md publishes) into DIR.

What runs: the pod's own engine (``ChatService``: the real loading code, ``kvsizing``, the in-flight
engine with its KV budget, chunked prefill, batched sampling and prefix store), in process, without
tritonserver (the Triton Python backend's model wraps exactly this object; what Triton adds per request is
an IPC hop measured by ``make bench-runtime`` on CPU, not here).

Models (random weights, built here; no weights can be downloaded where this runs):
- ``0.5b``: Qwen2-0.5B-Instruct's configuration, all 24 layers, its 151,936-entry vocabulary
  (``chatfleet_platform.localruntime.shaped``), saved to disk and loaded by the runtime's loader;
- ``7b``: Qwen2-7B-Instruct's configuration (28 layers, hidden 3,584, 28 query heads over 4 KV heads, MLP
  18,944, vocabulary 151,936 as the tokenizer's), built on the GPU in the precision under test and handed to the engine
  (saving and reloading 15 GB would cost the run's whole budget).

Traffic, per level of concurrency (closed loop: each conversation sends its next request when the last is
answered; the first requests are spread over the first second): a shared system prompt (the prefix store
serves it after the first request), a user turn of 20-400 words, one request in eight with ~1,000
tokens of earlier history; answers of mixed length (lognormal, median 64, cap 256 new tokens;
``answer_lengths``); sampling temperature 0.7, top-p 0.9, a per-request seed, one request in four with a
frequency penalty of 0.3; every request streamed (every token reported: ``stream_interval_ms`` 0).
Counted: the requests sent after the level's first ``--warmup-s`` seconds and before its end (each followed
to its last token); tokens/s: the tokens all conversations received inside that window.

Figures per case and level: output tokens/s over the measured window, TTFT p50/p90/p99 (submit to first
token, queueing included), inter-token gap p50/p99, requests refused (KV budget), peak GPU memory
allocated vs the weights and the KV budget ``kvsizing`` resolved. Sessions per GPU: the largest level whose
p90 TTFT stays within ``--ttft-slo-ms`` (300); the 0.5B fp16 case goes on past 256 (x1.5 each step, up to
``MAX_CLIMB``) until a level misses it. For the 7B shape, decode's share of HBM bandwidth at one conversation:
(weight bytes + KV bytes read per step) / inter-token p50, against the GPU's datasheet bandwidth and
against a device-to-device copy measured here.

Int8 (bitsandbytes LLM.int8()) runs the runtime's agreement check before serving; a random model's
next-token agreement says little, so the sheet records it and serves regardless
(``int8_min_agreement`` 0 here; the product's default is 0.98).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import queue
import random
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("runtime", "contract", "hack"):
    sys.path.insert(0, str(ROOT / sub))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from answer_lengths import answer_length  # noqa: E402
from serving_stats import inter_token_gaps  # noqa: E402

#: Qwen2-7B-Instruct's configuration (its config.json), the dimensions that set the cost of a token.
QWEN2_7B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    # Qwen2-7B pads its vocabulary to 152,064; here the shaped tokenizer's 151,936, so that every id the
    # model can emit decodes (the cost differs by 0.08 %).
    "vocab_size": 151_936,
    "max_position_embeddings": 32_768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

#: Datasheet HBM bandwidth (bytes/s) by a substring of torch.cuda.get_device_name().
DATASHEET_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,  # SXM5, HBM3 80 GB
    "A100-SXM4-80GB": 2.039e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "L4": 0.3e12,
}

SYSTEM_PROMPT = (
    "You are the customer service assistant of an online shop. Answer politely and briefly, "
    "ask for the order number when it is needed, and never promise refunds you cannot give."
)
ANSWER_CAP = 256
#: The most conversations a climbing case tries (its row limit).
MAX_CLIMB = 1024
#: The cases of a run, in the order they run (most wanted first, so a run cut short keeps them):
#: shape:precision:levels, "+" after the levels climbs past the last one while it meets the TTFT goal.
CASES = (
    "0.5b:fp16:1,32,128,256+",
    "0.5b:bf16:1,32,128,256",
    "7b:bf16:1,32,128",
    "0.5b:int8:1,128",
    "0.5b:fp32:1,128",
    "0.5b:auto:32",
    "7b:fp16:1,32",
)
HISTORY_WORDS = 700


@dataclass
class Record:
    """One request's timeline, as the engine reported it."""

    sent: float
    texts: list[float] = field(default_factory=list)
    done: float = 0.0
    tokens: int = 0
    error: str | None = None


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


class Prompts:
    """Chat requests of mixed length in the tokenizer's own words (the shaped models' BPE corpus)."""

    def __init__(self, seed: int = 0):
        from chatfleet_platform.localruntime.tiny import _corpus

        self.words = " ".join(_corpus()).split()
        self.seed = seed

    def _text(self, rng: random.Random, n: int) -> str:
        return " ".join(rng.choice(self.words) for _ in range(n))

    def request(self, k: int) -> tuple[str, str]:
        """(messages JSON, parameters JSON) of request k: the same for every case and level."""
        rng = random.Random(f"{self.seed}:{k}")
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        if k % 8 == 7:
            for _turn in range(4):
                messages.append({"role": "user", "content": self._text(rng, HISTORY_WORDS // 8)})
                messages.append({"role": "assistant", "content": self._text(rng, HISTORY_WORDS // 8)})
        messages.append({"role": "user", "content": self._text(rng, int(rng.uniform(20, 400)))})
        params = {
            "max_tokens": answer_length(k, ANSWER_CAP, self.seed),
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": k,
            "stream": True,
        }
        if k % 4 == 1:
            params["frequency_penalty"] = 0.3
        return json.dumps(messages), json.dumps(params)


class ClosedLoop:
    """`clients` conversations against one ChatService for `seconds`, each sending its next request when
    its last one is answered. Requests are rendered and submitted by one sender thread (as Triton's
    backend thread does in the pod), never on the engine's thread, whose completion callbacks only
    hand the sender the next turn."""

    def __init__(self, service, prompts: Prompts, clients: int, seconds: float, warmup_s: float):
        self.service = service
        self.prompts = prompts
        self.clients = clients
        self.seconds = seconds
        self.warmup_s = warmup_s
        self.records: list[Record] = []
        self.lock = threading.Lock()
        self.next_k = 0
        self.outstanding = 0
        self.idle = threading.Event()
        self.start = 0.0
        self.stop_at = 0.0
        self.turns: queue.Queue = queue.Queue()

    def _send(self) -> None:
        with self.lock:
            k = self.next_k
            self.next_k += 1
            self.outstanding += 1
        messages, params = self.prompts.request(k)
        record = Record(sent=time.perf_counter())
        prepared = self.service.prepare(
            messages, params, on_text=lambda *_: record.texts.append(time.perf_counter())
        )
        if prepared.request is None:
            raise RuntimeError(f"request {k} refused by prepare: {prepared.error}")

        def done(result, error) -> None:
            record.done = time.perf_counter()
            if error is not None:
                record.error = f"{type(error).__name__}: {error}"
            else:
                record.tokens = len(result.token_ids)
                record.error = result.error
            with self.lock:
                self.records.append(record)
                self.outstanding -= 1
                again = record.done < self.stop_at
                if again:
                    self.outstanding += 1  # the next turn, counted before the sender takes it
                    self.turns.put(True)
                elif self.outstanding == 0:
                    self.idle.set()

        self.service.submit(prepared.request, done)

    def _sender(self) -> None:
        while self.turns.get():
            with self.lock:
                self.outstanding -= 1
            self._send()

    def run(self) -> dict:
        """Run the level; its figures."""
        import torch

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.start = time.perf_counter()
        self.stop_at = self.start + self.warmup_s + self.seconds
        sender = threading.Thread(target=self._sender, name="gpu-sheet-sender", daemon=True)
        sender.start()
        for i in range(self.clients):
            # spread the first requests over the first second, as conversations arrive
            delay = self.start + i / self.clients - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with self.lock:
                self.outstanding += 1
            self.turns.put(True)
        finished = self.idle.wait(self.warmup_s + self.seconds + 600)
        self.turns.put(False)
        if not finished:
            raise TimeoutError(f"{self.outstanding} requests still running 10 minutes after the level")
        end = time.perf_counter()
        window_start = self.start + self.warmup_s
        window = self.stop_at - window_start
        # the requests sent inside the window (each followed to its end, after the window if need be)
        counted = [r for r in self.records if window_start <= r.sent < self.stop_at]
        ok = [r for r in counted if r.error is None]
        refused = [r for r in counted if r.error is not None]
        ttft = [r.texts[0] - r.sent for r in ok if r.texts]
        gaps = [gap for r in ok for gap in inter_token_gaps(r.texts)]
        # tokens produced inside the window, by every request (at full concurrency throughout)
        produced = sum(1 for r in self.records for t in r.texts if window_start <= t < self.stop_at)
        return {
            "clients": self.clients,
            "window_s": round(window, 2),
            "drain_s": round(end - self.stop_at, 2),
            "requests": len(ok),
            "refused": len(refused),
            "refusals": sorted({(r.error or "")[:120] for r in refused})[:3],
            "tokens_per_s": round(produced / window, 1),
            "ttft_ms": {q: ms(percentile(ttft, q)) for q in (50, 90, 99)},
            "itl_ms": {q: ms(percentile(gaps, q)) for q in (50, 99)},
            "mean_answer_tokens": round(statistics.fmean([r.tokens for r in ok]), 1) if ok else None,
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        }


def copy_bandwidth(device: str) -> float | None:
    """Bytes/s of a device-to-device copy of 2 GiB (bytes read + written), mean of 10 after 3 warm-ups."""
    import torch

    if not device.startswith("cuda"):
        return None
    a = torch.empty(2**30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / 10
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2**30 / seconds


def hf_generate_ms(model, device, prompt: int = 400, tokens: int = 64) -> float:
    """Milliseconds per new token of transformers' own greedy ``generate()`` at one row (the model alone,
    no engine): (time of `tokens` new tokens - time of 1) / (tokens - 1), after one warm-up."""
    import torch

    ids = torch.randint(0, 1000, (1, prompt), device=device)

    def run(n: int) -> float:
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(4)
    return round((run(tokens) - run(1)) / (tokens - 1) * 1000, 2)


class EngineProfile:
    """Where the engine's thread spends a level (cProfile of that thread) and what the GPU ran in it
    (torch.profiler's kernel totals), written to one text file per case (``--profile``)."""

    def __init__(self, path: Path):
        self.path = path
        self.profile = None
        self.path.write_text("")

    def attach(self, service) -> None:
        """Start the service's engine with its thread's loop under cProfile (enabled per level)."""
        import cProfile

        from chatfleet_runtime.engine import inflight

        self.profile = cProfile.Profile()
        original = inflight.InflightEngine._loop
        profile = self.profile

        def loop(engine) -> None:
            profile.enable()
            try:
                original(engine)
            finally:
                profile.disable()

        inflight.InflightEngine._loop = loop
        try:
            service.start_inflight()
        finally:
            inflight.InflightEngine._loop = original

    def level(self, clients: int, run):
        import io
        import pstats

        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.profile.disable()
        self.profile.clear()
        self.profile.enable()
        with profile(activities=activities) as prof:
            figures = run()
        text = io.StringIO()
        text.write(f"==== {clients} conversations: {json.dumps(figures)}\n")
        pstats.Stats(self.profile, stream=text).sort_stats("tottime").print_stats(30)
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        text.write(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60))
        with self.path.open("a") as f:
            f.write(text.getvalue())
        return figures


class Sheet:
    """The run: cases in order, each level's figures appended and written as they come."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.perf_counter() + args.budget_s
        self.data: dict = {"cases": [], "skipped": []}
        self.prompts = Prompts()

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def save(self) -> None:
        (self.out / "gpu-sheet.json").write_text(json.dumps(self.data, indent=1))
        (self.out / "gpu-sheet.md").write_text(render(self.data))

    def environment(self) -> None:
        import torch
        import transformers

        device = self.args.device
        gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
        total = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else None
        datasheet = next((v for k, v in DATASHEET_BANDWIDTH.items() if k in gpu), None)
        self.data["environment"] = {
            "gpu": gpu,
            "gpu_memory_gib": round(total / 2**30, 1) if total else None,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "datasheet_bandwidth_tb_s": datasheet and datasheet / 1e12,
            "copy_bandwidth_tb_s": (lambda b: b and round(b / 1e12, 2))(copy_bandwidth(device)),
            "settings": {
                k: getattr(self.args, k)
                for k in ("cases", "seconds", "warmup_s", "ttft_slo_ms", "layers_05b", "layers_7b")
            },
        }
        self.save()

    def service(self, shape: str, precision: str, model_dir: Path, max_rows: int):
        """The pod's ChatService for a case (the 7B model built here and handed over)."""
        from chatfleet_runtime.engine.loading import load_tokenizer
        from chatfleet_runtime.engine.service import ChatService, ServiceSettings

        settings = ServiceSettings(
            model_dir=str(model_dir),
            precision=precision,
            kind="KIND_GPU" if self.args.device.startswith("cuda") else "KIND_CPU",
            max_batch_size=max_rows,
            max_new_tokens=ANSWER_CAP,
            max_context_tokens=4096,
            stream_interval_ms=0,
            admission_queue=4 * max_rows,
            admission_wait_ms=60_000,
            prefill_chunk_tokens=self.args.prefill_chunk,
            int8_min_agreement=0.0,
        )
        if shape == "0.5b" and not self.args.direct:
            return ChatService(settings)
        import torch
        from chatfleet_platform.localruntime.shaped import QWEN2_0_5B, build_model
        from chatfleet_runtime.engine.loading import choose_placement, torch_dtype

        tokenizer = load_tokenizer(model_dir)

        placement = choose_placement(
            precision,
            settings.kind,
            cuda_available=torch.cuda.is_available(),
            bf16_supported=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        )
        if placement.precision == "int8":
            raise ValueError("int8 loads through the runtime's loader: run it without --direct")
        dims, layers = (
            (QWEN2_7B, self.args.layers_7b) if shape == "7b" else (QWEN2_0_5B, self.args.layers_05b)
        )
        model = build_model(
            tokenizer, layers, dims=dims, dtype=torch_dtype(placement.precision), device=placement.device
        )
        return ChatService(settings, model=model, tokenizer=tokenizer)

    def case(self, shape: str, precision: str, model_dir: Path, levels: list[int], climb: bool) -> None:
        import torch
        from chatfleet_runtime.engine.loading import weights_bytes

        name = f"{shape} {precision}"
        if self.left() < 45:
            self.data["skipped"].append(f"{name}: out of time ({self.left():.0f} s left)")
            self.save()
            return
        print(f"== {name}: loading", flush=True)
        t0 = time.perf_counter()
        entry: dict = {"shape": shape, "asked": precision, "levels": []}
        self.data["cases"].append(entry)
        service = None
        try:
            service = self.service(shape, precision, model_dir, MAX_CLIMB if climb else max(levels))
            entry.update(
                runs=f"{service.placement.precision} on {service.placement.device}",
                load_s=round(time.perf_counter() - t0, 1),
                weights_gib=round(weights_bytes(service.model) / 2**30, 2),
                kv=service.kv.describe(),
                kv_budget_gib=round(service.kv.budget / 2**30, 2),
                kv_rows=service.kv.rows,
                kv_bytes_per_position=service.generator.kv_bytes_per_position(),
            )
            if self.args.profile:
                entry["hf_generate_ms_per_token"] = hf_generate_ms(service.model, service.generator.device)
                self.save()
            if service.precision_check is not None:
                entry["int8_agreement"] = round(service.precision_check.ratio, 3)
            profile_path = self.out / f"gpu-sheet-profile-{shape}-{precision}.txt"
            profiler = EngineProfile(profile_path) if self.args.profile else None
            if profiler:
                profiler.attach(service)
            else:
                service.start_inflight()
            self.save()
            pending = list(levels)
            while pending:
                clients = pending.pop(0)
                if self.left() < self.args.seconds + self.args.warmup_s + 15:
                    self.data["skipped"].append(f"{name} at {clients}: out of time")
                    break
                print(f"   {clients} conversations", flush=True)
                loop = ClosedLoop(service, self.prompts, clients, self.args.seconds, self.args.warmup_s)
                figures = profiler.level(clients, loop.run) if profiler else loop.run()
                entry["levels"].append(figures)
                print(f"   {json.dumps(figures)}", flush=True)
                self.save()
                p90 = figures["ttft_ms"][90]
                met = p90 is not None and p90 <= self.args.ttft_slo_ms and not figures["refused"]
                if climb and not pending and met and int(clients * 1.5) <= MAX_CLIMB:
                    pending.append(int(clients * 1.5))
            if shape == "7b":
                entry["decode_bandwidth"] = self.bandwidth(entry, service)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            print(entry["traceback"], flush=True)
        finally:
            if service is not None:
                service.close()
            del service
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.save()

    def bandwidth(self, entry: dict, service) -> dict | None:
        """Decode's bytes read per step over its inter-token p50 at one conversation."""
        from chatfleet_runtime.engine.loading import weights_bytes

        one = next((lv for lv in entry["levels"] if lv["clients"] == 1), None)
        env = self.data["environment"]
        if not one or not one["itl_ms"][50]:
            return None
        # weights once per step, plus the row's KV (mean context ~ prompt ~400 + half the answer)
        per_step = weights_bytes(service.model) + 500 * service.generator.kv_bytes_per_position()
        achieved = per_step / (one["itl_ms"][50] / 1000)
        return {
            "bytes_per_step_gib": round(per_step / 2**30, 2),
            "achieved_tb_s": round(achieved / 1e12, 2),
            "share_of_datasheet": env["datasheet_bandwidth_tb_s"]
            and round(achieved / (env["datasheet_bandwidth_tb_s"] * 1e12), 3),
            "share_of_copy": env["copy_bandwidth_tb_s"]
            and round(achieved / (env["copy_bandwidth_tb_s"] * 1e12), 3),
        }

    def run(self) -> None:
        from chatfleet_platform.localruntime.shaped import build_shaped_model

        self.environment()
        models = Path(self.args.models)
        t0 = time.perf_counter()
        if self.args.direct:  # the tokenizer alone on disk; every model built on the device
            small = models / "tokenizer"
            if not (small / "tokenizer.json").exists():
                from chatfleet_platform.localruntime.shaped import QWEN2_0_5B, pad_vocabulary
                from chatfleet_platform.localruntime.tiny import build_tokenizer

                pad_vocabulary(build_tokenizer(), QWEN2_0_5B["vocab_size"]).save_pretrained(small)
        else:
            small = build_shaped_model(
                models / f"qwen2-0.5b-{self.args.layers_05b}", layers=self.args.layers_05b
            )
        self.data["environment"]["build_05b_s"] = round(time.perf_counter() - t0, 1)
        for case in self.args.cases:
            shape, precision, levels = case.split(":")
            climb = levels.endswith("+")
            self.case(shape, precision, small, [int(x) for x in levels.rstrip("+").split(",")], climb)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def render(data: dict) -> str:
    """The sheet as markdown: one row per case and level, then capacity and bandwidth."""
    env = data.get("environment", {})
    lines = [
        f"GPU: {env.get('gpu')} ({env.get('gpu_memory_gib')} GiB), torch {env.get('torch')}, "
        f"transformers {env.get('transformers')}, CUDA {env.get('cuda')}",
        "",
        "| model | asked → runs | conversations | tokens/s | TTFT p50 / p90 / p99 ms | inter-token p50 / p99 ms "
        "| refused | peak GiB | weights GiB | KV budget GiB |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for c in data.get("cases", []):
        head = f"| {c['shape']} | {c['asked']} → {c.get('runs', '?')}"
        if c.get("error") and not c["levels"]:
            lines.append(f"{head} | - | failed: {c['error'][:160]} | | | | | | |")
        for lv in c["levels"]:
            t, i = lv["ttft_ms"], lv["itl_ms"]
            lines.append(
                f"{head} | {lv['clients']} | {_fmt(lv['tokens_per_s'])} "
                f"| {_fmt(t[50])} / {_fmt(t[90])} / {_fmt(t[99])} | {_fmt(i[50])} / {_fmt(i[99])} "
                f"| {lv['refused']} | {_fmt(lv['peak_allocated_gib'])} | {_fmt(c.get('weights_gib'))} "
                f"| {_fmt(c.get('kv_budget_gib'))} |"
            )
    slo = env.get("settings", {}).get("ttft_slo_ms", 300)
    lines += ["", f"Sessions per GPU at p90 TTFT ≤ {slo} ms (largest level measured that met it):", ""]
    for c in data.get("cases", []):
        met = [
            lv["clients"]
            for lv in c["levels"]
            if lv["ttft_ms"][90] is not None and lv["ttft_ms"][90] <= slo and not lv["refused"]
        ]
        lines.append(
            f"- {c['shape']} {c.get('runs', c['asked'])}: {max(met) if met else 'none of the levels'}"
        )
        if "int8_agreement" in c:
            lines.append(
                f"  (int8 agreement with bf16/fp16 on the calibration prompts: {c['int8_agreement']})"
            )
        if c.get("decode_bandwidth"):
            b = c["decode_bandwidth"]
            lines.append(
                f"  decode at 1 conversation reads {b['bytes_per_step_gib']} GiB a step: {b['achieved_tb_s']} TB/s, "
                f"{b['share_of_datasheet']} of the datasheet's {env.get('datasheet_bandwidth_tb_s')} TB/s, "
                f"{b['share_of_copy']} of a copy measured here ({env.get('copy_bandwidth_tb_s')} TB/s)"
            )
        if c.get("error"):
            lines.append(f"  failed: {c['error'][:300]}")
    for s in data.get("skipped", []):
        lines.append(f"- skipped: {s}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-results/gpu-sheet")
    parser.add_argument("--models", default=os.environ.get("CHATFLEET_MODELS", "/tmp/chatfleet-gpu-models"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--cases",
        type=lambda s: s.split(";"),
        default=list(CASES),
        help="shape:precision:levels cases separated by ';', in the order they run (default: CASES)",
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per level")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--ttft-slo-ms", type=float, default=300.0)
    parser.add_argument("--prefill-chunk", type=int, default=1024)
    parser.add_argument("--budget-s", type=float, default=380.0, help="start no level past this")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="write where the engine's time goes, per level, and time transformers' own generate() per case",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="build the 0.5B model on the device too (skips its save and load)",
    )
    parser.add_argument("--layers-05b", type=int, default=24)
    parser.add_argument("--layers-7b", type=int, default=QWEN2_7B["num_hidden_layers"])
    args = parser.parse_args(argv)
    sheet = Sheet(args)
    sheet.run()
    print(render(sheet.data), flush=True)
    return 0 if all(not c.get("error") for c in sheet.data["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
