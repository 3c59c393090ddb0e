"""Circuit breaker and fallback answers for the chat API (plain Python, injected clock).

Closed: calls go to Triton; ``failure_threshold`` consecutive failures open it. Open: calls are answered
from the fallback at once; after ``reset_timeout_s`` it turns half-open. Half-open: one probe call at a
time goes to Triton; success closes the breaker, failure opens it again for another ``reset_timeout_s``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
#: Numeric value of each state for the ``chatfleet_breaker_state`` gauge.
STATE_VALUE = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


class CircuitBreaker:
    """Consecutive-failure breaker with a timed half-open probe.

    >>> t = [0.0]; b = CircuitBreaker(failure_threshold=2, reset_timeout_s=5, clock=lambda: t[0])
    >>> b.record_failure(); b.record_failure(); b.state
    'open'
    >>> b.allow()
    False
    >>> t[0] = 5.0; b.allow(), b.allow()   # half-open: exactly one probe
    (True, False)
    >>> b.record_success(); b.state
    'closed'
    """

    def __init__(
        self,
        failure_threshold: int = 3,
        reset_timeout_s: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, str], None] | None = None,
    ):
        self.failure_threshold = max(1, failure_threshold)
        self.reset_timeout_s = reset_timeout_s
        self.clock = clock
        self.on_change = on_change
        self._state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_in_flight = False
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        """Current state, turning open into half-open once the reset timeout has passed."""
        with self._lock:
            self._tick()
            return self._state

    def _set(self, state: str) -> None:
        old, self._state = self._state, state
        if old != state and self.on_change is not None:
            self.on_change(old, state)

    def _tick(self) -> None:
        if self._state == OPEN and self.clock() - self._opened_at >= self.reset_timeout_s:
            self._set(HALF_OPEN)
            self._probe_in_flight = False

    def allow(self) -> bool:
        """Whether a call may go to the backend now (half-open admits one probe)."""
        with self._lock:
            self._tick()
            if self._state == CLOSED:
                return True
            if self._state == HALF_OPEN and not self._probe_in_flight:
                self._probe_in_flight = True
                return True
            return False

    def record_success(self) -> None:
        """A call succeeded: reset the failure count and close."""
        with self._lock:
            self._failures = 0
            self._probe_in_flight = False
            self._set(CLOSED)

    def record_failure(self) -> None:
        """A call failed (unavailable, timeout, server error): count it; open at the threshold."""
        with self._lock:
            self._failures += 1
            self._probe_in_flight = False
            if self._state == HALF_OPEN or self._failures >= self.failure_threshold:
                self._opened_at = self.clock()
                self._set(OPEN)

    def release(self) -> None:
        """A call ended without a verdict (e.g. the client left): free the half-open probe slot."""
        with self._lock:
            self._probe_in_flight = False

    def configure(self, failure_threshold: int, reset_timeout_s: float) -> None:
        """New thresholds, in place: the state, the failure count and an open breaker's start are kept.
        A lower threshold takes effect at the next failure; an open breaker turns half-open once the new
        reset timeout has passed since it opened.

        >>> b = CircuitBreaker(failure_threshold=3); b.record_failure(); b.configure(2, 1.0)
        >>> b.state, b.failure_threshold; b.record_failure(); b.state
        ('closed', 2)
        'open'
        """
        with self._lock:
            self.failure_threshold = max(1, failure_threshold)
            self.reset_timeout_s = reset_timeout_s


@dataclass(frozen=True)
class FaqEntry:
    """A canned answer and the words that select it."""

    keywords: tuple[str, ...]
    answer: str


_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def faq_entries(data: Any) -> tuple[FaqEntry, ...]:
    """The FAQ entries of a parsed list ``[{"question"|"keywords", "answer"}]``: a question's words of
    more than three letters are its keywords. A ValueError names the first entry that is not one.

    >>> faq_entries([{"question": "How do I reset my password?", "answer": "A"}])[0].keywords
    ('password', 'reset')
    >>> faq_entries([{"keywords": "refund", "answer": "A"}])
    Traceback (most recent call last):
    ...
    ValueError: faq[0].keywords: must be a list of strings
    """
    if not isinstance(data, list):
        raise ValueError("faq: must be a list of entries")
    entries = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("answer"), str):
            raise ValueError(f"faq[{i}]: needs an answer string")
        keywords = item.get("keywords")
        if keywords is not None and not (
            isinstance(keywords, list) and all(isinstance(k, str) for k in keywords)
        ):
            raise ValueError(f"faq[{i}].keywords: must be a list of strings")
        question = item.get("question", "")
        if not isinstance(question, str):
            raise ValueError(f"faq[{i}].question: must be a string")
        if not keywords:
            keywords = sorted(w for w in _words(question) if len(w) > 3)
        entries.append(FaqEntry(tuple(k.lower() for k in keywords), item["answer"]))
    return tuple(entries)


class Fallback:
    """Answers when Triton cannot: the best-matching FAQ entry, else the configured fallback text.

    The FAQ may be replaced while requests read it (``replace_faq``): a reader sees the old tuple or the
    new one, never a mix."""

    def __init__(self, text: str, faq: Sequence[FaqEntry] = ()):
        self.text = text
        self.faq: tuple[FaqEntry, ...] = tuple(faq)

    def replace_faq(self, faq: Sequence[FaqEntry]) -> None:
        """Answer from these entries from now on (one assignment of a new tuple)."""
        self.faq = tuple(faq)

    def answer(self, messages: Sequence[dict[str, str]]) -> tuple[str, str]:
        """(answer, source) for the last user message; source is "faq" or "text"."""
        last = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        words = _words(last)
        best, score = None, 0
        faq = self.faq  # one read: a concurrent replace_faq does not change the entries under the loop
        for entry in faq:
            hits = sum(1 for k in entry.keywords if k in words)
            if hits > score:
                best, score = entry, hits
        if best is not None:
            return best.answer, "faq"
        return self.text, "text"

    @classmethod
    def from_config(cls, text: str, faq_source: str | None) -> Fallback:
        """Load the FAQ from a JSON/YAML file path or inline JSON: [{"question"|"keywords", "answer"}]."""
        if not faq_source:
            return cls(text)
        raw = faq_source.strip()
        if not raw.startswith("["):
            path = Path(raw)
            raw = path.read_text()
            if path.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(raw) or []
            else:
                data = json.loads(raw)
        else:
            data = json.loads(raw)
        return cls(text, faq_entries(data))
