"""The Python backend's load-handshake hang, reproduced in the real tritonserver, and its bound.

Test design: tritonserver (2.51, from the pytriton wheel) loads the tiny model; while the model instance
is inside initialize() (its load mark says so), the test stops the stub process for 6 s (SIGSTOP, then
SIGCONT): the stall a loaded node gives a stub's health thread. tritonserver judges the stub unhealthy,
waits for it to exit and never kills it; the stub finishes initialize() and waits for a command. Without
the watch nothing ends that (the first test: neither ready nor exited 60 s later). With it, the stub ends
itself `load_handshake_timeout_s` after initialize() returned, tritonserver fails the load and exits, and
the termination log says why. The last test shows the watch leaves a healthy load alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from chatfleet_platform.localruntime.testing import model_config
from chatfleet_runtime.engine.load_watch import LOADING, MARKS_ROOT, LoadMarks
from chatfleet_runtime.engine.termination import TERMINATION_LOG_ENV
from chatfleet_runtime.launcher.tritonhome import TritonServer, local_repository

pytestmark = [pytest.mark.triton, pytest.mark.slow]

STALL_S = 6


def start(rt_workdir, tiny_model_dir, name: str, timeout_s: int, monkeypatch) -> tuple[TritonServer, object]:
    base = rt_workdir / f"load-watch-{name}"
    base.mkdir(parents=True, exist_ok=True)
    log = base / "termination-log"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(log))  # /dev/termination-log in a pod
    repo = local_repository(
        base / "repo",
        model_config(
            tiny_model_dir,
            max_context_tokens=512,
            max_new_tokens=16,
            extra_parameters={"load_handshake_timeout_s": str(timeout_s)},
        ),
    )
    server = TritonServer(repo, home=rt_workdir / "triton-home", log_path=base / "triton.log").start()
    return server, log


def stub_of(server: TritonServer) -> int:
    """The model instance's stub: tritonserver's one child process."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(server.proc.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert len(out) == 1, out
    return int(out[0])


def stall_inside_initialize(server: TritonServer) -> None:
    """Wait until the instance is inside initialize(), then stop its stub for STALL_S seconds."""
    marks = LoadMarks.for_server(MARKS_ROOT, server_pid=server.proc.pid)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if marks.folder.exists() and any(p.read_text() == LOADING for p in marks.folder.glob("*.mark")):
            break
        assert server.proc.poll() is None, server.log_tail()
        time.sleep(0.05)
    else:
        pytest.fail(f"the instance never entered initialize():\n{server.log_tail()}")
    stub = stub_of(server)
    os.kill(stub, signal.SIGSTOP)
    try:
        time.sleep(STALL_S)  # the stall itself is what is tested, not a wait for something
    finally:
        os.kill(stub, signal.SIGCONT)


def alive(pid: int) -> bool:
    """Whether the process runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def outcome(server: TritonServer, within_s: float) -> str:
    """'ready', 'exited <code>' or 'hung' (neither within the time)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            return f"exited {server.proc.returncode}"
        if server.ready():
            return "ready"
        time.sleep(0.5)
    return "hung"


def test_without_the_watch_a_stub_stalled_inside_initialize_hangs_the_load(
    rt_workdir, tiny_model_dir, monkeypatch
):
    """The root cause, shown: Triton 2.51's Python backend never recovers from a one-second stall."""
    server, _ = start(rt_workdir, tiny_model_dir, "off", 0, monkeypatch)
    try:
        stall_inside_initialize(server)
        assert outcome(server, 60) == "hung", server.log_tail()
    finally:
        server.stop()


def test_with_the_watch_the_hung_load_ends_and_says_why(rt_workdir, tiny_model_dir, monkeypatch):
    server, log = start(rt_workdir, tiny_model_dir, "on", 5, monkeypatch)
    try:
        stall_inside_initialize(server)
        assert outcome(server, 90) == "exited 1", server.log_tail()
        message = log.read_text()
    finally:
        server.stop()
    assert message.startswith(
        "load handshake hung: Triton has not marked the model ready 5 s after the last model instance's "
        "initialize() returned"
    ), message
    assert "failed to load all models" in (rt_workdir / "load-watch-on" / "triton.log").read_text()


def test_the_watch_leaves_a_healthy_load_serving(rt_workdir, tiny_model_dir, monkeypatch):
    """A watch that misread readiness would end this stub 1 s after its load: the model must stay ready."""
    server, log = start(rt_workdir, tiny_model_dir, "healthy", 1, monkeypatch)
    try:
        server.wait_ready(180)
        stub = stub_of(server)
        deadline = time.monotonic() + 6  # several times the 1 s timeout: a wrong verdict would have come
        while time.monotonic() < deadline:
            assert server.ready() and alive(stub), server.log_tail()
            time.sleep(0.5)
    finally:
        server.stop()
    assert not log.exists()
