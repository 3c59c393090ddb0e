"""Teardowns that an interrupt does not cut half-way."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """A SIGINT (Ctrl-C, or `make test` stopping a lane when another lane's layer failed) that comes
    inside the block interrupts only once the block is done: a cluster's teardown cut half-way leaves its
    processes running and its host changes (bridges, iptables rules) in place. Outside the main thread
    (where no signal handler can be set) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if came:
        raise KeyboardInterrupt
