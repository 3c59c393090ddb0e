"""Start, recognise and stop the platform's own processes, and pick free loopback ports.

A process is recorded as (pid, kernel start time). It counts as ours only while both match: a PID
recorded in a stale state file that now belongs to someone else is never signalled.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import PlatformError

#: Where free_port looks: above the fixed ports of Kubernetes' node components (10248-10359), below the
#: NodePort range (30000-32767) and the kernel's ephemeral range.
LOWEST_PORT, HIGHEST_PORT = 20000, 29999
#: Ports this process has handed out: never handed out twice (a cluster picks six before starting any).
_given: set[int] = set()
_given_lock = threading.Lock()


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (32768-60999 by default)."""
    try:
        low, high = (int(v) for v in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(preferred: int | None = None, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port free on 127.0.0.1: `preferred` when it is free, else one below the kernel's ephemeral range.

    Below it, because a port is picked before the server that will listen on it starts: one from the
    ephemeral range can meanwhile become the source port of any outgoing connection on the machine, and
    the server then fails with "address already in use" (it did: a kube-controller-manager of the real-pod
    layer, its port taken by a connection of the layer beside it). Ports below the range are never handed
    out that way. Picked at random from LOWEST_PORT..HIGHEST_PORT (so that lanes and workers starting
    clusters side by side rarely try the same one); where the ephemeral range leaves no room there, the
    kernel picks one.
    """
    if preferred and _bindable(preferred):
        return preferred
    low, _ = ephemeral or ephemeral_range()
    top = min(HIGHEST_PORT, low - 1)
    if top - LOWEST_PORT >= 1000:
        rng = random.Random()
        for _ in range(200):
            port = rng.randint(LOWEST_PORT, top)
            with _given_lock:
                if port in _given or not _bindable(port):
                    continue
                if len(_given) > (HIGHEST_PORT - LOWEST_PORT) // 2:  # a long session: start the record again
                    _given.clear()
                _given.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass(frozen=True)
class Proc:
    """A process we started: its PID and its start time in clock ticks since boot."""

    pid: int
    started: int

    def to_json(self) -> list[int]:
        return [self.pid, self.started]

    @classmethod
    def from_json(cls, value) -> Proc | None:
        """Parse [pid, started]; None for anything else."""
        if isinstance(value, list) and len(value) == 2:
            return cls(int(value[0]), int(value[1]))
        return None


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when it does not exist."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def is_ours(proc: Proc | None) -> bool:
    """Whether proc is alive (not a zombie) and is still the process we started."""
    if not proc:
        return False
    fields = _stat(proc.pid)
    return bool(fields) and fields[0] != "Z" and int(fields[19]) == proc.started


def start(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start argv in its own session (so it outlives the caller), logging to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                cwd=str(cwd) if cwd else None,
                start_new_session=True,
            )
        except OSError as e:
            raise PlatformError(f"{name}: cannot start {argv[0]}: {e}") from e
    started = start_time(proc.pid)
    if started is None:  # exited at once; keep a record that matches nothing alive
        _reap(proc.pid)
        return Proc(proc.pid, -1)
    return Proc(proc.pid, started)


def stop(proc: Proc | None, *, timeout: float = 10.0) -> bool:
    """SIGTERM our process (then SIGKILL after timeout); returns whether it was ours and is gone."""
    if not proc or not is_ours(proc):
        return False
    pid = proc.pid
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_ours(proc):
            _reap(pid)
            return True
        _reap(pid)
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    """Collect a child's exit status if it is our child (no-op otherwise)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def log_tail(log: Path, lines: int = 15) -> str:
    """Last lines of a log file, for error messages."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(
    what: str,
    check,
    *,
    timeout: float,
    log: Path | None = None,
    proc: Proc | None = None,
    interval: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> float:
    """Poll check() until true; returns seconds waited. Fails fast if the process died. On a time-out the
    error carries `detail()` (e.g. the status waited on) and the log's tail."""
    t0 = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - t0
        except Exception:
            pass
        if proc and not is_ours(proc):
            tail = log_tail(log) if log else ""
            raise PlatformError(f"{what}: the process exited while starting; log {log}:\n{tail}")
        if time.monotonic() - t0 > timeout:
            more = f" {detail()}" if detail else ""
            tail = f"; log {log}:\n{log_tail(log)}" if log else ""
            raise PlatformError(f"{what}: not ready after {timeout:.0f}s{more}{tail}")
        time.sleep(interval)


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether GET `url` answers 200 within 2 s (a readiness check for `wait_for`; errors raise)."""
    with urllib.request.urlopen(url, timeout=2, context=context) as r:
        return r.status == 200
