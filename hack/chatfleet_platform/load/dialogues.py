"""Dialogues as a chat front-end holds them: multi-turn, streamed, with a session id, counted turn by turn.

`DialogueLoad` runs `concurrency` users from background threads. Each user holds one dialogue at a time:
`turns` streamed turns under one `X-Session-Id`, a short think time between turns, then a new dialogue.
With `pin`, every turn after the first echoes the `x-chatfleet-revision` header the first answer carried
(what a client or an edge does to keep a dialogue on its revision behind Gateway API).

What it counts, the figures the zero-drop tests and `make bench-release-traffic` report:
- `cut`: a stream that began (HTTP 200) and ended without `data: [DONE]`, or broke while reading;
- `non_2xx`: answers with another status (the code is kept in `codes`);
- `failed`: no answer at all (connection refused or reset before the status line, a time-out);
- `lost_history`: a turn whose answer says fewer stored turns were loaded than the dialogue had saved
  (the chat API reports `chatfleet.history_turns`; expected min(turns done, history window));
- `switched`: dialogues in which a turn was answered by another revision than the first turn.
Bounded in count (`max_dialogues`) and time (`max_seconds`); it stops by itself.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

REVISION_HEADER = "x-chatfleet-revision"


@dataclass
class TurnResult:
    """One turn as the client saw it."""

    outcome: str
    """ok, cut, failed, or http-<code>."""
    revision: str = ""
    history_turns: int | None = None
    history: str = ""
    """The chat API's `chatfleet.history`: ok, unavailable (Redis could not be read), none."""
    at: float = 0.0
    error: str = ""
    """Why a turn failed or was cut: the exception's class and first words; for a lost history, the counts."""
    fallback: str = ""
    """The reason the chat API gave when it answered with its fallback text instead of the model."""
    lost: bool = False
    """The answer loaded fewer stored turns than the dialogue had saved."""
    dialogue_started: float = 0.0
    """When the turn's dialogue began (monotonic): which dialogues began after a fault."""
    seconds: float = 0.0
    """How long the turn took, from the request to the stream's end (or the failure)."""
    upstream: str = ""
    """The replica that answered, as the gateway named it (DialogueLoad.upstream_header; '' when not asked)."""


def _first_event(body: str) -> dict[str, Any] | None:
    """The first JSON `data:` event of a server-sent event stream (None when there is none)."""
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                return json.loads(line[6:])
            except ValueError:
                return None
    return None


def _why(exc: BaseException) -> str:
    """An exception as a short reason, e.g. 'ConnectionRefusedError: [Errno 111] Connection refused'."""
    return f"{type(exc).__name__}: {str(exc)[:80]}"


def chat_turn(
    url: str,
    session_id: str,
    text: str,
    *,
    pin: str = "",
    source: str | None = None,
    timeout: float = 60.0,
    max_tokens: int = 6,
    upstream_header: str = "",
) -> TurnResult:
    """One streamed turn of a dialogue through `url` (http://host:port); never raises. With
    `upstream_header`, the result's `upstream` is that response header (the replica that answered)."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(
        parsed.hostname, parsed.port or 80, timeout=timeout, source_address=(source, 0) if source else None
    )
    headers = {"Content-Type": "application/json", "X-Session-Id": session_id}
    if pin:
        headers[REVISION_HEADER] = pin
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": True}
    now = time.monotonic()
    try:
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
        except (http.client.HTTPException, OSError) as exc:
            return TurnResult("failed", at=now, error=_why(exc))
        revision = resp.getheader(REVISION_HEADER) or ""
        try:
            text_body = resp.read().decode(errors="replace")
        except (http.client.HTTPException, OSError) as exc:
            outcome = "cut" if resp.status == 200 else f"http-{resp.status}"
            return TurnResult(outcome, revision, at=now, error=_why(exc))
    finally:
        conn.close()
    upstream = (resp.getheader(upstream_header) or "") if upstream_header else ""
    if resp.status != 200:
        # who refused: a draining chat API answers JSON with Retry-After, a gateway with no backend its own text
        retry = resp.getheader("Retry-After")
        why = f"pin={pin or '-'} retry-after={retry or '-'} {' '.join(text_body.split())[:70]}"
        return TurnResult(f"http-{resp.status}", revision, at=now, error=why, upstream=upstream)
    if "data: [DONE]" not in text_body:
        return TurnResult("cut", revision, at=now, upstream=upstream)
    first = _first_event(text_body) or {}
    info = first.get("chatfleet") or {}
    turns = info.get("history_turns")
    fallback = str(info.get("reason") or "?") if info.get("fallback") else ""
    return TurnResult(
        "ok",
        revision,
        turns if isinstance(turns, int) else None,
        history=str(info.get("history") or ""),
        at=now,
        fallback=fallback,
        upstream=upstream,
    )


@dataclass(frozen=True)
class DialogueRecord:
    """One finished dialogue: when it began and ended (monotonic), its revisions in turn order, switched or
    not, and the replicas that answered its turns (in order; empty without DialogueLoad.upstream_header)."""

    started: float
    ended: float
    revisions: tuple[str, ...]
    switched: bool
    replicas: tuple[str, ...] = ()


@dataclass
class DialogueLoad:
    """Concurrent users holding multi-turn streamed dialogues through one URL (see the module docstring)."""

    url: str
    concurrency: int = 8
    turns: int = 5
    pin: bool = True
    history_window: int = 5
    """spec.runtime.sessions.historyTurns of the bot: the most stored turns a request can get back."""
    think_seconds: tuple[float, float] = (0.1, 0.5)
    max_dialogues: int | None = None
    max_seconds: float = 600.0
    sources: tuple[str, ...] = ()
    """Client addresses (behind a Service with ClientIP affinity); () = this host's default one. Each
    dialogue takes an address no dialogue used in the last `reuse_after` seconds, so it arrives as a
    new client, as real users do: a user who kept one address would stay on one pod for good."""
    reuse_after: float = 65.0
    """Seconds an address rests between dialogues: more than the affinity timeout (the session TTL)."""
    timeout: float = 60.0
    max_tokens: int = 6
    """Tokens each answer may have (long answers keep streams open: what a fault can cut)."""
    seed: int = 7
    upstream_header: str = ""
    """A response header naming the replica that answered (a gateway's, e.g. the pool gateway's
    x-gateway-upstream): recorded per turn, for `kept_replica`."""
    results: list[TurnResult] = field(default_factory=list)
    dialogues: int = 0
    switched: int = 0
    lost_history: int = 0
    revisions: Counter = field(default_factory=Counter)
    records: list[DialogueRecord] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)
    _started: int = 0
    _address_free_at: dict[str, float] = field(default_factory=dict)

    def _claim(self) -> bool:
        """Whether a user may begin one more dialogue (the count bound)."""
        with self._lock:
            if self.max_dialogues is not None and self._started >= self.max_dialogues:
                return False
            self._started += 1
            return True

    def _address(self) -> str | None:
        """A client address for a new dialogue (None: the default one); waits while all are resting."""
        if not self.sources:
            return None
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                for addr in self.sources:
                    if self._address_free_at.get(addr, 0.0) <= now:
                        self._address_free_at[addr] = float("inf")  # in use
                        return addr
            time.sleep(0.2)
        return None

    def _release(self, addr: str | None) -> None:
        """The dialogue on `addr` ended: the address rests `reuse_after` seconds."""
        if addr is not None:
            with self._lock:
                self._address_free_at[addr] = time.monotonic() + self.reuse_after

    def _dialogue(self, rng: random.Random, source: str | None) -> None:
        """One whole dialogue: `turns` turns, pinned to the first answer's revision when `pin`."""
        sid = uuid.uuid4().hex
        first_revision, saved, switched, lost = "", 0, False, 0
        previous = "first turn"
        started, seen, replicas = time.monotonic(), [], []
        for k in range(self.turns):
            if self._stop.is_set():
                break
            pin = first_revision if self.pin and k > 0 else ""
            r = chat_turn(
                self.url,
                sid,
                f"turn {k} of {sid[:6]}",
                pin=pin,
                source=source,
                timeout=self.timeout,
                max_tokens=self.max_tokens,
                upstream_header=self.upstream_header,
            )
            r.dialogue_started = started
            r.seconds = time.monotonic() - r.at
            with self._lock:
                self.results.append(r)
                if r.revision:
                    self.revisions[r.revision] += 1
            if r.outcome == "ok":
                seen.append(r.revision)
                replicas.append(r.upstream)
                if k == 0 or not first_revision:
                    first_revision = first_revision or r.revision
                elif r.revision and r.revision != first_revision:
                    switched = True
                expected = min(saved, self.history_window)
                if r.history_turns is not None and r.history_turns < expected:
                    lost += 1
                    r.lost = True
                    r.error = (
                        f"history {r.history or '?'} from {r.revision or '?'}: {r.history_turns} of {expected}"
                        f" saved turns loaded ({previous})"
                    )
                saved += 1
            previous = f"previous turn {r.outcome} from {r.revision or '?'}" + (
                f", a fallback answer ({r.fallback})" if r.fallback else ""
            )
            time.sleep(rng.uniform(*self.think_seconds))
        with self._lock:
            self.dialogues += 1
            self.switched += int(switched)
            self.lost_history += lost
            self.records.append(
                DialogueRecord(started, time.monotonic(), tuple(seen), switched, tuple(replicas))
            )

    def start(self) -> DialogueLoad:
        """Start the users (each its own thread and random stream)."""
        t0 = time.monotonic()

        def user(i: int) -> None:
            rng = random.Random(self.seed * 1000 + i)
            while not self._stop.is_set() and time.monotonic() - t0 < self.max_seconds and self._claim():
                source = self._address()
                try:
                    self._dialogue(rng, source)
                finally:
                    self._release(source)

        self._threads = [
            threading.Thread(target=user, args=(i,), daemon=True) for i in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()
        return self

    def wait(self, timeout: float) -> bool:
        """Wait until every user is done (the count or time bound); whether they all are."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def stop(self) -> dict[str, Any]:
        """Let each user finish the turn it is in, then stop; the summary."""
        self._stop.set()
        self.wait(self.timeout + 30)
        return self.summary()

    def failures_between(self, t0: float, t1: float) -> int:
        """Turns that began in [t0, t1) and were not answered well (anything but ok, or a lost history)."""
        with self._lock:
            return sum(1 for r in self.results if t0 <= r.at < t1 and (r.outcome != "ok" or r.lost))

    def since(self, t: float) -> Counter:
        """Outcomes of the turns that began at or after monotonic time t."""
        with self._lock:
            return Counter(r.outcome for r in self.results if r.at >= t)

    def switched_between(self, t0: float, t1: float) -> tuple[int, int]:
        """(dialogues that began at or after t0 and ended by t1, how many of them switched revision)."""
        with self._lock:
            inside = [r for r in self.records if r.started >= t0 and r.ended <= t1]
        return len(inside), sum(r.switched for r in inside)

    def kept_replica(self, t0: float, t1: float) -> tuple[int, int]:
        """Over the dialogues that began at or after t0 and ended by t1: (their answered turns after the
        first, how many of those the replica of the turn before answered: the one holding the prefix KV)."""
        with self._lock:
            inside = [r.replicas for r in self.records if r.started >= t0 and r.ended <= t1]
        pairs = [(a, b) for replicas in inside for a, b in itertools.pairwise(replicas)]
        return len(pairs), sum(1 for a, b in pairs if a and a == b)

    def bad_turns(self) -> list[TurnResult]:
        """Every turn not answered well (cut, non-2xx, no answer, a lost history), in the order they began."""
        with self._lock:
            return sorted((r for r in self.results if r.outcome != "ok" or r.lost), key=lambda r: r.at)

    def summary(self) -> dict[str, Any]:
        """The counts: turns, dialogues, cut streams, non-2xx answers, failures, lost histories, switches."""
        with self._lock:
            outcomes = Counter(r.outcome for r in self.results)
            return {
                "turns": len(self.results),
                "ok": outcomes["ok"],
                "dialogues": self.dialogues,
                "cut": outcomes["cut"],
                "non_2xx": sum(v for k, v in outcomes.items() if k.startswith("http-")),
                "codes": {k: v for k, v in outcomes.items() if k.startswith("http-")},
                "failed": outcomes["failed"],
                "lost_history": self.lost_history,
                "switched": self.switched,
                "switched_share": round(self.switched / self.dialogues, 4) if self.dialogues else 0.0,
                "revisions": dict(self.revisions),
                "errors": dict(Counter(r.error for r in self.results if r.error and not r.lost)),
                "lost": [r.error for r in self.results if r.lost][:10],
                "fallbacks": dict(Counter(r.fallback for r in self.results if r.fallback)),
            }
