"""The load-handshake watch: when a load is judged hung, and what ending the stub leaves behind.

Test design: the verdict and the marks are plain functions and files; the watch loop runs on a fake
clock and a fake readiness answer; the readiness probe meets a real local HTTP server; ending the stub
runs in a real child process. The real hang, in a real tritonserver, is reproduced in
tests/integration/runtime/test_runtime_load_watch_served.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from chatfleet_platform.localruntime.testing import readiness_stub
from chatfleet_runtime.engine import load_watch
from chatfleet_runtime.engine.load_watch import LoadMarks, model_ready, verdict, watch
from chatfleet_runtime.engine.termination import TERMINATION_LOG_ENV


@pytest.mark.parametrize(
    ("ready", "loading", "since", "expected"),
    [
        (True, 0, 500.0, "ready"),
        (True, 2, 0.0, "ready"),
        (False, 0, 119.9, "wait"),  # the last initialize() returned less than the timeout ago
        (False, 0, 120.0, "hung"),
        (False, 1, 5000.0, "wait"),  # an instance still inside initialize(): a slow load is never cut
    ],
)
def test_verdict(ready, loading, since, expected):
    assert verdict(ready=ready, loading=loading, last_finished=0.0, now=since, timeout=120) == expected


def test_marks_count_instances_inside_initialize_and_the_latest_finish(tmp_path):
    marks = LoadMarks(tmp_path / "server")
    marks.begin("chat_0_0")
    marks.begin("chat_0_1")
    assert marks.state() == (2, 0.0)
    marks.finish("chat_0_0", now=100.0)
    assert marks.state() == (1, 100.0)
    marks.finish("chat_0_1", now=250.0)
    assert marks.state() == (0, 250.0)


def test_each_tritonserver_process_has_its_own_marks_folder(tmp_path):
    """A tritonserver restarted in the same container (same PID in its namespace) must not read old marks."""
    mine = LoadMarks.for_server(tmp_path)
    assert mine.folder.parent == tmp_path
    pid, started = mine.folder.name.split("-")
    assert int(pid) > 0 and int(started) > 0  # the parent's PID and its start time since boot
    assert LoadMarks.for_server(tmp_path, server_pid=1).folder != mine.folder


class Clock:
    def __init__(self):
        self.now = 1000.0

    def sleep(self, seconds):
        self.now += seconds


def test_the_watch_stops_once_the_model_is_ready(tmp_path):
    marks, clock, answers = LoadMarks(tmp_path), Clock(), iter([False, False, True])
    marks.begin("chat_0_0")
    marks.finish("chat_0_0", now=clock.now)
    given_up = []
    seen = watch(
        "http://x",
        marks,
        timeout=60,
        ready=lambda _url: next(answers),
        clock=lambda: clock.now,
        sleep=clock.sleep,
        give_up=given_up.append,
    )
    assert (seen, given_up) == ("ready", [])


def test_the_watch_gives_up_timeout_seconds_after_the_last_initialize_returned(tmp_path):
    marks, clock = LoadMarks(tmp_path), Clock()
    marks.begin("chat_0_0")
    marks.begin("chat_0_1")
    marks.finish("chat_0_0", now=clock.now)
    polls: list[float] = []

    def ready(_url):
        polls.append(clock.now)
        if clock.now >= 1300:  # the second instance returns at 1300: the timeout counts from there
            marks.finish("chat_0_1", now=1300.0)
        return False

    given_up: list[str] = []
    seen = watch(
        "http://x",
        marks,
        timeout=60,
        poll=10,
        ready=ready,
        clock=lambda: clock.now,
        sleep=clock.sleep,
        give_up=given_up.append,
    )
    assert seen == "hung"
    assert polls[-1] == 1360.0  # 60 s after the last finish, not after the first one's
    assert len(given_up) == 1 and "60 s after the last model instance's initialize() returned" in given_up[0]


def test_model_ready_asks_triton_over_http():
    with readiness_stub("/v2/models/chat/ready") as base:
        assert model_ready(f"{base}/v2/models/chat/ready")
        assert not model_ready(f"{base}/v2/models/other/ready")
    assert not model_ready(f"{base}/v2/models/chat/ready")  # not listening (Triton still loading): not ready


def test_ending_the_stub_reports_why_and_ends_the_process_at_once(tmp_path):
    log = tmp_path / "termination-log"
    code = (
        "import threading, time\n"
        "from chatfleet_runtime.engine.load_watch import end_this_stub\n"
        "threading.Thread(target=end_this_stub, args=('load handshake hung: test',)).start()\n"
        "time.sleep(30)\n"  # the stub's main thread, waiting for a command: the process ends regardless
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**_env(), TERMINATION_LOG_ENV: str(log)},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 3
    assert log.read_text() == "load handshake hung: test"
    assert "chatfleet: load handshake hung: test" in proc.stderr


def test_no_watch_without_a_readiness_url_or_with_timeout_zero(tmp_path, monkeypatch):
    monkeypatch.delenv(load_watch.READY_URL_ENV, raising=False)
    marks = LoadMarks(tmp_path)
    marks.begin("chat_0_0")
    assert load_watch.start_watch("chat_0_0", marks, 120) is None
    assert marks.state()[0] == 0  # the finish is marked all the same (other instances' watches count it)
    monkeypatch.setenv(load_watch.READY_URL_ENV, "http://127.0.0.1:1/v2/models/chat/ready")
    assert load_watch.start_watch("chat_0_0", marks, 0) is None


def _env():
    import os

    return dict(os.environ)
