"""A batch of requests from several client threads, counted by outcome (the gateway tests' load), and
one chat through the gateway on a new connection."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any


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


def gateway_chat(
    port: int, host: str, body: dict[str, Any], judge: Callable[[http.client.HTTPResponse], str]
) -> str:
    """POST `body` to /v1/chat/completions through the gateway on 127.0.0.1:`port` for `host`, on a new
    connection: `judge(response)` says the outcome; a connection or HTTP error before it is its class name."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"Host": host, "Content-Type": "application/json"},
        )
        return judge(conn.getresponse())
    except (http.client.HTTPException, OSError) as exc:
        return type(exc).__name__
    finally:
        conn.close()
