"""Find a tritonserver, assemble its backend folder and model repository, and run it as a subprocess.

Two installations are supported:

- the NGC image (``/opt/tritonserver``, or ``$TRITONSERVER_HOME``): used as is in the pod;
- the ``nvidia-pytriton`` wheel (local runs, tests, benchmark): its bundled ``tritonserver`` with the
  Python backend assembled into a home folder (docs/runtime.md, "Notes on the Triton recipe"): the
  matching stub copied into ``backends/python``, ``LD_LIBRARY_PATH`` with this interpreter's libpython
  first and ``nvidia_pytriton.libs``, the venv's ``bin`` first on ``PATH`` (the stub runs isolated and
  finds the venv through it), and cwd ``/`` (the stub puts cwd on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from chatfleet_contract.tritonconfig import (
    MODEL_NAME,
    READY_URL_ENV,
    ChatModelConfig,
    model_repository_configs,
)

MODEL_CODE = Path(__file__).resolve().parents[1] / "engine" / "triton_model" / "model.py"


@dataclass(frozen=True)
class Installation:
    """A tritonserver binary with the folders and environment it needs."""

    binary: Path
    backend_dir: Path
    cache_dir: Path | None
    env: Mapping[str, str] = field(default_factory=dict)


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on host (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _pytriton_root() -> Path | None:
    try:
        import pytriton
    except ImportError:
        return None
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    return root if (root / "bin" / "tritonserver").exists() else None


def find_installation(home: Path | None = None) -> Installation:
    """Locate tritonserver: $TRITONSERVER_HOME / /opt/tritonserver, else the pytriton wheel (assembled in home)."""
    for candidate in (os.environ.get("TRITONSERVER_HOME"), "/opt/tritonserver"):
        if candidate and (Path(candidate) / "bin" / "tritonserver").exists():
            base = Path(candidate)
            return Installation(base / "bin" / "tritonserver", base / "backends", None, {})
    root = _pytriton_root()
    if root is None:
        raise FileNotFoundError("no tritonserver: set TRITONSERVER_HOME or install nvidia-pytriton")
    home = Path(home or Path.home() / ".cache" / "chatfleet" / "triton-home")
    return assemble_pytriton_home(root, home)


def assemble_pytriton_home(root: Path, home: Path) -> Installation:
    """Copy the Python backend and this interpreter's stub from the wheel into home (idempotent)."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    backend = home / "backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        _copy_if_changed(root / "backends" / "python" / name, backend / name)
    _copy_if_changed(
        root / "python_backend_stubs" / py / "triton_python_backend_stub",
        backend / "triton_python_backend_stub",
    )
    caches = home / "caches"
    if not (caches / "local").exists() and (root / "caches" / "local").exists():
        shutil.copytree(root / "caches" / "local", caches / "local")
    libs = root.parent.parent / "nvidia_pytriton.libs"
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(
            p for p in (libdir, str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p
        ),
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
    }
    return Installation(root / "bin" / "tritonserver", home / "backends", caches, env)


def _copy_if_changed(src: Path, dst: Path) -> None:
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        tmp = dst.with_suffix(".tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)


def write_repository(repo: Path, configs: Mapping[str, str], model_code: Path = MODEL_CODE) -> Path:
    """Write <repo>/<model>/config.pbtxt and <repo>/<model>/1/model.py for each model config."""
    repo.mkdir(parents=True, exist_ok=True)
    for name, text in configs.items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(text)
        shutil.copy2(model_code, repo / name / "1" / "model.py")
    return repo


def local_repository(repo: Path, cfg: ChatModelConfig) -> Path:
    """A model repository for local runs from a ChatModelConfig (the pod builds it from its config files)."""
    return write_repository(repo, model_repository_configs(cfg))


@dataclass(frozen=True)
class Ports:
    """Triton's three ports."""

    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> Ports:
        """Three unused ports."""
        return cls(free_port(host), free_port(host), free_port(host))


def command(
    inst: Installation, repo: Path, ports: Ports, address: str = "127.0.0.1", extra: list[str] | None = None
) -> list[str]:
    """The tritonserver command line (CPU-friendly flags; see docs/runtime.md)."""
    cmd = [
        str(inst.binary),
        f"--model-repository={repo}",
        f"--backend-directory={inst.backend_dir}",
        f"--http-address={address}",
        f"--http-port={ports.http}",
        f"--grpc-address={address}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={address}",
        f"--metrics-port={ports.metrics}",
        "--allow-cpu-metrics=true",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-default-byte-size=16777216",
        "--log-verbose=0",
        "--exit-timeout-secs=5",
    ]
    if inst.cache_dir is not None:
        cmd.append(f"--cache-directory={inst.cache_dir}")
    return cmd + list(extra or [])


def environment(
    inst: Installation, base: Mapping[str, str] | None = None, *, http: str | None = None
) -> dict[str, str]:
    """Process environment for tritonserver (base environment plus the installation's needs).

    With ``http`` (Triton's HTTP address, host:port), the chat model's readiness URL for its load watch
    (``chatfleet_runtime.engine.load_watch``)."""
    env = dict(os.environ if base is None else base)
    env.update(inst.env)
    if http is not None:
        env[READY_URL_ENV] = f"http://{http}/v2/models/{MODEL_NAME}/ready"
    return env


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM a process group we started (by its leader's PID), SIGKILL after timeout; no-op when gone."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


class TritonServer:
    """A tritonserver subprocess on 127.0.0.1: start, wait until ready, stop by PID."""

    def __init__(
        self,
        repo: Path,
        *,
        home: Path | None = None,
        ports: Ports | None = None,
        log_path: Path | None = None,
        extra_args: list[str] | None = None,
    ):
        self.repo = Path(repo)
        self.inst = find_installation(home)
        self.ports = ports or Ports.free()
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP endpoint."""
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC endpoint."""
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        """URL of the Prometheus metrics page."""
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def start(self) -> TritonServer:
        """Start the process (cwd /, own process group) without waiting."""
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            command(self.inst, self.repo, self.ports, extra=self.extra_args),
            env=environment(self.inst, http=f"127.0.0.1:{self.ports.http}"),
            cwd="/",
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if out is not subprocess.DEVNULL:
            out.close()
        return self

    def ready(self) -> bool:
        """Whether /v2/health/ready answers 200 and the metrics port listens.

        tritonserver opens its metrics port after the HTTP endpoint: ready-by-HTTP alone lets a scrape
        right after it be refused.
        """
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=1) as resp:
                if resp.status != 200:
                    return False
            with socket.create_connection(("127.0.0.1", self.ports.metrics), timeout=1):
                return True
        except OSError:
            return False

    def wait_ready(self, timeout: float = 120.0) -> TritonServer:
        """Block until ready; raise (with the log tail) if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.2)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log (when logging to a file)."""
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM by PID, SIGKILL after timeout; safe to call twice."""
        proc, self.proc = self.proc, None
        stop_process(proc, timeout)

    def __enter__(self) -> TritonServer:
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def running_triton(repo: Path, **kwargs) -> Iterator[TritonServer]:
    """Context manager: a ready TritonServer on free ports, stopped on exit (even on failure)."""
    server = TritonServer(repo, **kwargs)
    try:
        server.start().wait_ready()
        yield server
    finally:
        server.stop()
