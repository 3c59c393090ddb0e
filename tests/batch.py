"""A batch of requests from several client threads, counted by outcome (the gateway tests' load)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable


def outcomes(call: Callable[[int], str], requests: int, users: int, limit_s: float) -> Counter[str]:
    """`call(i)` for i in range(requests), from `users` threads taking the next i in turn, for at most
    `limit_s` seconds (a bound, not a speed goal); how many calls gave each outcome. Fewer than `requests`
    in all means the limit came first."""
    counted: Counter[str] = Counter()
    lock = threading.Lock()
    next_i = iter(range(requests))
    deadline = time.monotonic() + limit_s

    def user() -> None:
        while time.monotonic() < deadline:
            with lock:
                i = next(next_i, None)
            if i is None:
                return
            outcome = call(i)
            with lock:
                counted[outcome] += 1

    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit_s + 60)
    return counted
