"""Local processes for tests, `make serve`, the demo and the benchmark: Redis, Triton, the chat API.

Everything binds 127.0.0.1 on free ports, runs in its own process group and is stopped by PID (even on
failure). The one-call entry point is ``local_runtime()``::

    with local_runtime(workdir) as rt:          # tiny model + Redis + Triton + chat API
        print(send_chat(rt.api_url, "Hello!"))   # -> the assistant's reply (str)
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatfleet_contract.tritonconfig import ChatModelConfig
from chatfleet_runtime.launcher.tritonhome import TritonServer, free_port, local_repository, stop_process

from chatfleet_platform.servers.services import Redis


def _wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "server") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready at {url} after {timeout:.0f}s")


@dataclass(kw_only=True)
class _ServedProcess:
    """A server of ours as a subprocess on 127.0.0.1 (or ``host``, an address of this machine's own: a
    test's host bridge): its users' port and its metrics port (free ports when 0), stopped by PID."""

    log_path: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """Base URL of the port users reach."""
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Its scrape endpoint (``GET /metrics`` on the metrics port)."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def stop(self) -> None:
        """Stop by PID."""
        stop_process(self.proc)
        self.proc = None


@dataclass
class ChatApiProcess(_ServedProcess):
    """``python -m chatfleet_runtime.chat.api`` as a subprocess on 127.0.0.1."""

    triton_grpc: str
    env: dict[str, str]
    admin_port: int = 0

    @property
    def admin_url(self) -> str:
        """Base URL of its admin port (probes, the drain, shadow records)."""
        return f"http://{self.host}:{self.admin_port}"

    def start(self, timeout: float = 60.0, wait_ready: bool = True) -> ChatApiProcess:
        """Start and (by default) wait for /readyz."""
        self.port = self.port or free_port()
        self.admin_port = self.admin_port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chatfleet_runtime.chat.api",
                f"--host={self.host}",
                f"--port={self.port}",
                f"--admin-port={self.admin_port}",
                f"--metrics-port={self.metrics_port}",
                f"--triton-grpc={self.triton_grpc}",
            ],
            # No endpoints to leave here, so no settle time on SIGTERM (a test may still set one).
            env={**os.environ, "CHATFLEET_DRAIN_SETTLE_SECONDS": "0", **self.env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if out is not subprocess.DEVNULL:
            out.close()
        _wait_http(
            f"{self.admin_url}/readyz" if wait_ready else f"{self.admin_url}/healthz",
            timeout,
            self.proc,
            "chat API",
        )
        return self


@dataclass
class RelayProcess(_ServedProcess):
    """``python -m chatfleet_runtime.relay`` (the stream relay) as a subprocess on 127.0.0.1, in front of
    the given chat API URLs."""

    upstreams: list[str]
    stall_seconds: float = 15.0
    max_resumes: int = 3

    def start(self, timeout: float = 30.0) -> RelayProcess:
        """Start and wait for its ports (``GET /v1/models`` answers as a replica does; it moves no turn)."""
        self.port = self.port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        command = [sys.executable, "-m", "chatfleet_runtime.relay", f"--host={self.host}"]
        command += [f"--port={self.port}", f"--metrics-port={self.metrics_port}"]
        command += [f"--stall-seconds={self.stall_seconds}"]
        command += [f"--max-resumes={self.max_resumes}"]
        command += [f"--upstream={url}" for url in self.upstreams]
        self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if out is not subprocess.DEVNULL:
            out.close()
        _wait_http(self.metrics_url, timeout, self.proc, "stream relay")
        _wait_http(f"{self.url}/v1/models", timeout, self.proc, "stream relay")
        return self


@dataclass
class Replica:
    """One pod's two processes on 127.0.0.1: a tritonserver and the chat API over it (tests and benchmarks
    that kill, freeze and restart replicas)."""

    triton: TritonServer
    api: ChatApiProcess

    @classmethod
    def create(cls, workdir: Path, repo: Path, name: str, env: dict[str, str]) -> Replica:
        """A replica of the model repository, logging to workdir/{triton,api}-<name>.log (not started)."""
        triton = TritonServer(repo, home=workdir / "triton-home", log_path=workdir / f"triton-{name}.log")
        return cls(triton, ChatApiProcess("", env, log_path=workdir / f"api-{name}.log"))

    @property
    def up(self) -> bool:
        """Both processes running."""
        return all(p is not None and p.poll() is None for p in (self.triton.proc, self.api.proc))

    def start(self, timeout: float = 180.0) -> Replica:
        """Start Triton, wait for its model, then the chat API over it (again on the same ports)."""
        self.triton.start().wait_ready(timeout)
        self.api.triton_grpc = self.triton.grpc_url
        self.api.start(timeout=timeout)
        return self

    def signal(self, sig: int, *, api: bool = True) -> None:
        """A signal to Triton's process group and (unless ``api`` is False) the chat API's: SIGKILL for a
        pod that dies, SIGSTOP for a node gone silent. The chat API first: killed second, it could still tell
        its clients that its Triton went away."""
        for proc in (self.api.proc if api else None, self.triton.proc):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL both processes and reap them: nothing drains, nothing is saved."""
        self.signal(signal.SIGKILL)
        for proc in (self.triton.proc, self.api.proc):
            if proc is not None:
                proc.wait(10)

    def stop(self) -> None:
        """Stop both by PID (a frozen one is woken first)."""
        self.signal(signal.SIGCONT)
        self.api.stop()
        self.triton.stop()


def tiny_model(cache_dir: Path, size: str = "tiny") -> Path:
    """Build (once) and return the tiny model folder under cache_dir."""
    from chatfleet_platform.localruntime.tiny import build_tiny_model

    return build_tiny_model(Path(cache_dir) / f"{size}-model", size=size)


def model_config(model_dir: Path, **overrides: Any) -> ChatModelConfig:
    """A CPU ChatModelConfig for local runs (batch up to 32, 2048-token context)."""
    params = {"torch_threads": str(overrides.pop("torch_threads", 1))}
    params.update(overrides.pop("extra_parameters", {}))
    defaults: dict[str, Any] = {
        "model_dir": str(model_dir),
        "kind": "KIND_CPU",
        "max_batch_size": 32,
        "max_queue_delay_us": 5_000,
        "max_new_tokens": 256,
        "max_context_tokens": 2048,
        "extra_parameters": params,
    }
    defaults.update(overrides)
    return ChatModelConfig(**defaults)


@dataclass
class LocalRuntime:
    """Handles of a running local runtime."""

    workdir: Path
    model_dir: Path
    triton: TritonServer
    redis: Redis | None
    api: ChatApiProcess

    @property
    def api_url(self) -> str:
        """Base URL of the chat API (OpenAI-compatible under /v1)."""
        return self.api.url


@contextlib.contextmanager
def local_runtime(
    workdir: Path,
    *,
    model_dir: Path | None = None,
    with_redis: bool = True,
    api_env: dict[str, str] | None = None,
    config: ChatModelConfig | None = None,
) -> Iterator[LocalRuntime]:
    """Tiny model + Redis + Triton + chat API, all on 127.0.0.1; everything stopped on exit."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = Path(model_dir) if model_dir else tiny_model(workdir)
    cfg = config or model_config(model_dir)
    repo = local_repository(workdir / "model-repository", cfg)
    triton = TritonServer(repo, home=workdir / "triton-home", log_path=workdir / "tritonserver.log")
    redis_srv = Redis(workdir / "redis") if with_redis else None
    api = None
    try:
        triton.start()
        if redis_srv is not None:
            redis_srv.start()
        triton.wait_ready()
        env = {"CHATFLEET_MODEL_NAME": "chatfleet-tiny"}
        if redis_srv is not None:
            env["CHATFLEET_REDIS_URL"] = redis_srv.url
        env.update(api_env or {})
        api = ChatApiProcess(triton.grpc_url, env, log_path=workdir / "chat-api.log")
        api.start()
        yield LocalRuntime(workdir, model_dir, triton, redis_srv, api)
    finally:
        if api is not None:
            api.stop()
        triton.stop()
        if redis_srv is not None:
            redis_srv.stop()


def post_json(
    url: str, body: Any, timeout: float = 60.0, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    """POST JSON with the standard library; returns (status, parsed body) for 2xx and 4xx/5xx alike."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def send_chat(api_url: str, text: str, *, session_id: str | None = None, max_tokens: int = 32) -> str:
    """Send one user message to the chat API and return the assistant's reply."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    if session_id:
        body["session_id"] = session_id
    status, reply = post_json(f"{api_url}/v1/chat/completions", body)
    if status != 200:
        raise RuntimeError(f"chat API answered {status}: {reply}")
    return reply["choices"][0]["message"]["content"]


def metric_value(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples matching labels (0 when absent)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


@contextlib.contextmanager
def readiness_stub(path: str) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering GET `path` with 200 and any other path with 404, as Triton's
    readiness routes answer; yields its base URL (http://127.0.0.1:<port>) and is closed on exit."""

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == path else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_concurrently(fn, n: int) -> list:
    """Run fn(i) in n threads at once; return results in order (exceptions re-raised)."""
    results: list = [None] * n
    errors: list = []
    barrier = threading.Barrier(n)

    def work(i):
        try:
            barrier.wait(10)
            results[i] = fn(i)
        except Exception as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results
