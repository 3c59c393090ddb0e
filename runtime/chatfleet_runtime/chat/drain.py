"""Draining a chat-API replica that is going away: the state (``Drain``) and the preStop client.

A pod that is terminated (scale-down, rollback, promotion, node drain) stops taking new work
gracefully, finishes its streams, then exits. The operator gives both containers of the pod the same
preStop hook, ``python3 -m chatfleet_runtime.chat.drain --url=http://127.0.0.1:8082`` (the admin port): it
starts the drain (``POST /drain``, accepted from the pod's loopback only) and waits until the chat API says it is drained (``GET /drain``), so the ``triton``
container gets its SIGTERM only once the chat API no longer needs it. See docs/runtime.md "Draining".

``Drain`` is the whole state, pure and clock-injected: the chat API only tells it when a chat request
arrives and ends, and asks it whether a new one can still be served and whether it is drained. The
client below is standard library only, so the hook starts fast in the runtime image.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

#: Seconds kept free before the pod must exit: a request is admitted only if its deadline ends this
#: much before the grace period does (the answer still has to be written and the process to stop).
EXIT_MARGIN_S = 2.0


class Drain:
    """One replica's drain: when it began, chat requests in flight, the last arrival, refusals.

    - ``draining``: ``begin()`` was called (``POST /drain``, or a SIGTERM without a preStop hook).
    - a chat request is admitted while ``now + request_timeout_s <= began + grace_s - EXIT_MARGIN_S``
      (it can finish before the pod must exit); after that it is refused (``admit()`` is False). One
      that came past the endpoints (the stream relay's) is refused from ``settled`` on.
    - ``settled``: at least ``settle_s`` seconds since the drain began (the endpoint removal needs that
      long to reach kube-proxy and the gateway). From then on every answer says ``Connection: close``
      (``middleware.DrainGate``), for the clients whose kept-alive connections still reach this pod.
    - ``drained``: settled, nothing in flight, and no chat request arrived within the last ``settle_s``
      seconds.
    """

    def __init__(
        self,
        *,
        settle_s: float,
        grace_s: float,
        request_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settle_s = settle_s
        self.grace_s = grace_s
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.began: float | None = None
        """When the drain began (clock time), None while serving normally."""
        self.inflight = 0
        """Chat requests between arrival and their last byte."""
        self.last_arrival: float | None = None
        self.refused = 0
        """Chat requests refused because they could not finish before the pod must exit."""

    @property
    def draining(self) -> bool:
        """Whether the drain has begun."""
        return self.began is not None

    def begin(self) -> bool:
        """Start draining (idempotent); True when this call started it."""
        if self.began is not None:
            return False
        self.began = self.clock()
        return True

    def enter(self) -> None:
        """A chat request arrived (admitted or not): it is in flight until ``leave``."""
        self.inflight += 1
        self.last_arrival = self.clock()

    def leave(self) -> None:
        """A chat request ended (its response is sent, or its client left)."""
        self.inflight = max(0, self.inflight - 1)

    def exit_at(self) -> float | None:
        """When the pod must be gone (drain start + grace), None while not draining."""
        return None if self.began is None else self.began + self.grace_s

    def admit(self, past_endpoints: bool = False) -> bool:
        """Whether a new chat request can be served to its deadline before the pod must exit; a False
        answer counts a refusal. A request that came `past_endpoints` (the stream relay's, sent to this
        replica's address) is refused once settled: the proxies no longer send here, and the relay takes
        the refusal to another replica instead of holding the drain open."""
        if self.began is None:
            return True
        in_time = self.clock() + self.request_timeout_s <= self.began + self.grace_s - EXIT_MARGIN_S
        if in_time and not (past_endpoints and self.settled()):
            return True
        self.refused += 1
        return False

    def settled(self) -> bool:
        """Draining for at least ``settle_s``: long enough for the gateway and kube-proxy to have seen the
        endpoint go."""
        return self.began is not None and self.clock() - self.began >= self.settle_s

    def drained(self) -> bool:
        """Settled, nothing in flight, and quiet for ``settle_s``."""
        if not self.settled() or self.inflight:
            return False
        return self.last_arrival is None or self.clock() - self.last_arrival >= self.settle_s

    def state(self) -> dict[str, Any]:
        """The JSON of ``GET /drain``: draining, inflight, drained, since_seconds, refused."""
        since = 0.0 if self.began is None else round(self.clock() - self.began, 3)
        return {
            "draining": self.draining,
            "inflight": self.inflight,
            "drained": self.drained(),
            "since_seconds": since,
            "refused": self.refused,
        }


# ---- the preStop client: python3 -m chatfleet_runtime.chat.drain --url=http://127.0.0.1:8082 ----------

#: Seconds the client waits when neither --timeout nor CHATFLEET_DRAIN_GRACE_SECONDS says.
DEFAULT_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.5
CALL_TIMEOUT_S = 2.0


def default_timeout(env: Mapping[str, str] | None = None) -> float:
    """CHATFLEET_DRAIN_GRACE_SECONDS minus the exit margin, else DEFAULT_TIMEOUT_S."""
    env = os.environ if env is None else env
    try:
        return max(0.0, float(env["CHATFLEET_DRAIN_GRACE_SECONDS"]) - EXIT_MARGIN_S)
    except (KeyError, ValueError):
        return DEFAULT_TIMEOUT_S


def call(method: str, url: str) -> dict[str, Any]:
    """One request to the chat API's /drain, its JSON answer (OSError or ValueError when it fails)."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=CALL_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def run(
    url: str,
    timeout_s: float,
    *,
    request: Callable[[str, str], dict[str, Any]] = call,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval_s: float = POLL_INTERVAL_S,
) -> str:
    """Begin the drain and wait until drained or timeout_s; the one line saying what happened."""
    endpoint = url.rstrip("/") + "/drain"
    start = clock()
    try:
        state = request("POST", endpoint)
    except (OSError, ValueError) as exc:
        return f"chatfleet drain: {endpoint} unreachable ({exc}); nothing to drain"
    while not state.get("drained"):
        left = start + timeout_s - clock()
        if left <= 0:
            return (
                f"chatfleet drain: not drained after {timeout_s:g} s "
                f"(inflight {state.get('inflight')}, refused {state.get('refused')}); giving up"
            )
        sleep(min(interval_s, left))
        try:
            state = request("GET", endpoint)
        except (OSError, ValueError) as exc:
            return f"chatfleet drain: the chat API went away after {clock() - start:.1f} s ({exc})"
    return (
        f"chatfleet drain: drained after {clock() - start:.1f} s "
        f"(draining for {state.get('since_seconds')} s, refused {state.get('refused')})"
    )


def main(argv: list[str] | None = None) -> int:
    """The preStop hook: drain the chat API at --url, print one line, exit 0 whatever happened."""
    parser = argparse.ArgumentParser(description="drain a chatfleet chat API before the pod stops")
    parser.add_argument("--url", default="http://127.0.0.1:8082", help="the chat API's admin port")
    parser.add_argument("--timeout", type=float, default=None, help="seconds (default: grace - 2, or 120)")
    args = parser.parse_args(argv)
    timeout_s = default_timeout() if args.timeout is None else args.timeout
    try:
        line = run(args.url, timeout_s)
    except Exception as exc:  # a failing preStop hook only makes an event; never fail
        line = f"chatfleet drain: failed ({exc!r})"
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
