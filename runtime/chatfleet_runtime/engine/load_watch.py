"""A bound on the Python backend's load handshake: a load that can never finish ends in minutes, not never.

Why: in the Triton release the pod runs (2.51, the Python backend of r24.10), tritonserver waits for each
instance's ``initialize()`` reply in one-second slices and, after each slice, asks whether the stub is
healthy: a flag the stub's health thread sets every 300 ms. When that thread gets no CPU for about a second
(a loaded node, throttling, page faults while weights load), the stub is judged unhealthy although it is
alive; tritonserver then sends it a last message and waits for the process to exit, without ever killing
it. The stub, meanwhile, finishes ``initialize()``, takes that message as the end of its start and waits
for the next command. Both wait forever, nothing is logged, and only the kubelet's startup probe
(10 minutes by default) ends it. Upstream's later change (python_backend PR #408, Triton 25.08) widens
the slice to 5 s, so it is rarer there, not gone; the pytriton wheel bundles 2.51.

What: every instance marks the start and end of its ``initialize()`` in a folder shared by the instances
of this tritonserver process (``LoadMarks``). After its own ``initialize()`` returned, an instance watches
Triton's readiness of the model on the pod's loopback (``CHATFLEET_TRITON_READY_URL``, which the launcher
sets). Once no instance is still inside ``initialize()`` and ``timeout`` seconds have passed since the last
one finished, a model that is still not ready is a hung handshake (``verdict``): the instance writes why
to the termination log and ends its own process. tritonserver's wait then returns, the load fails,
tritonserver exits ("failed to load all models") and the kubelet restarts the container at once, with
the reason in ``lastState.terminated.message``. A load that finishes makes every watch stop. A load that
is slow inside ``initialize()`` (weights, the int8 check) is never cut: only the time after the last
``initialize()`` returned counts.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chatfleet_contract.tritonconfig import READY_URL_ENV

from chatfleet_runtime.engine.termination import write_termination_message

#: Where the instances of one tritonserver process mark their initialize(); a tritonserver restarted in
#: the same container gets its own folder (its PID and start time name it).
MARKS_ROOT = Path(tempfile.gettempdir()) / "chatfleet-load"
LOADING = "loading"


def verdict(*, ready: bool, loading: int, last_finished: float, now: float, timeout: float) -> str:
    """``ready``, ``wait`` or ``hung``, from what the watch sees.

    ``loading``: instances inside ``initialize()``; ``last_finished``: when the latest one returned.

    >>> verdict(ready=False, loading=0, last_finished=0.0, now=119.0, timeout=120)
    'wait'
    >>> verdict(ready=False, loading=0, last_finished=0.0, now=120.0, timeout=120)
    'hung'
    >>> verdict(ready=False, loading=1, last_finished=0.0, now=900.0, timeout=120)
    'wait'
    """
    if ready:
        return "ready"
    if loading or now - last_finished < timeout:
        return "wait"
    return "hung"


@dataclass(frozen=True)
class LoadMarks:
    """One file per instance in a folder of this tritonserver process: ``loading``, or when it finished."""

    folder: Path

    @classmethod
    def for_server(cls, root: Path = MARKS_ROOT, server_pid: int | None = None) -> LoadMarks:
        """The folder of the tritonserver process that started this stub (the stub's parent)."""
        pid = os.getppid() if server_pid is None else server_pid
        return cls(root / f"{pid}-{_start_time(pid)}")

    def begin(self, instance: str) -> None:
        """This instance entered initialize()."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write(instance, LOADING)

    def finish(self, instance: str, now: float | None = None) -> None:
        """This instance's initialize() returned."""
        self._write(instance, repr(time.time() if now is None else now))

    def state(self) -> tuple[int, float]:
        """(instances inside initialize(), when the latest one returned; 0.0 when none has)."""
        loading, last = 0, 0.0
        for path in self.folder.glob("*.mark"):
            text = path.read_text().strip()
            if text == LOADING:
                loading += 1
            else:
                last = max(last, float(text))
        return loading, last

    def _write(self, instance: str, text: str) -> None:
        path = self.folder / f"{_safe(instance)}.mark"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def model_ready(url: str) -> bool:
    """Whether Triton answers 200 for the model's readiness (not listening yet: not ready)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def end_this_stub(message: str) -> None:
    """Report why, then end this process: tritonserver's wait for it returns and the load fails."""
    write_termination_message(message)
    print(f"chatfleet: {message}", file=sys.stderr, flush=True)  # the stub's stderr is the container log
    os._exit(3)


def watch(
    url: str,
    marks: LoadMarks,
    *,
    timeout: float,
    poll: float = 2.0,
    ready: Callable[[str], bool] = model_ready,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    give_up: Callable[[str], None] = end_this_stub,
) -> str:
    """Poll until the model is ready (``ready``) or the handshake is judged hung (``give_up`` called)."""
    while True:
        loading, last = marks.state()
        seen = verdict(ready=ready(url), loading=loading, last_finished=last, now=clock(), timeout=timeout)
        if seen == "ready":
            return seen
        if seen == "hung":
            give_up(
                f"load handshake hung: Triton has not marked the model ready {timeout:.0f} s after the last "
                "model instance's initialize() returned (Triton 2.51's Python backend waits for a stub it "
                "judged unhealthy during a slow load and never kills it); ending the stub so that "
                "tritonserver fails the load and the container restarts"
            )
            return seen
        sleep(poll)


def start_watch(instance: str, marks: LoadMarks, timeout: float) -> threading.Thread | None:
    """Mark this instance's initialize() done and watch the handshake in a daemon thread.

    None when there is nothing to watch: no readiness URL in the environment (a tritonserver started by
    hand) or a timeout of 0 (turned off)."""
    marks.finish(instance)
    url = os.environ.get(READY_URL_ENV)
    if not url or timeout <= 0:
        return None
    thread = threading.Thread(
        target=watch, args=(url, marks), kwargs={"timeout": timeout}, name="chatfleet-load-watch", daemon=True
    )
    thread.start()
    return thread


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat, field 22); '0' without it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
