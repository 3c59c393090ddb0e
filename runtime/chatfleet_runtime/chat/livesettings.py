"""Fallback and breaker settings from a file that changes under the running chat API (no restart).

The operator writes ``spec.fallback`` as the pod annotation ``chatfleet.io/fallback``; a downward API
volume makes it a file (``CHATFLEET_FALLBACK_FILE``) that kubelet rewrites when the annotation changes,
empty when the annotation is gone. The file is JSON, every key optional::

    {"faq": [{"question": "How do I reset my password?", "answer": "..."},
             {"keywords": ["refund"], "answer": "..."}],
     "breaker": {"failures": 3, "resetSeconds": 5}}

A key that is absent (or null) takes the environment's value (``CHATFLEET_FAQ``,
``CHATFLEET_BREAKER_FAILURES``, ``CHATFLEET_BREAKER_RESET_SECONDS``); an empty or missing file takes them
all. Unknown keys are ignored (a newer operator's). ``LiveSettings.poll`` reads the file and applies a
content it has not seen yet: the ``Fallback``'s FAQ is replaced (its text stays the environment's) and the
``CircuitBreaker`` gets the thresholds in place (its state kept). A content that is not valid changes
nothing: the last good settings stay, and it is logged and counted once (not at every poll).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatfleet_runtime.chat.breaker import CircuitBreaker, Fallback, FaqEntry, faq_entries

log = logging.getLogger("chatfleet.api")

APPLIED, INVALID = "applied", "invalid"


@dataclass(frozen=True)
class FallbackSettings:
    """The settings the file may change: the FAQ and the breaker's thresholds."""

    faq: tuple[FaqEntry, ...]
    failures: int
    reset_s: float


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse(text: str, defaults: FallbackSettings) -> FallbackSettings:
    """The settings a file's text says, each absent key the default's; ValueError when it is not valid.

    >>> env = FallbackSettings((), 3, 5.0)
    >>> parse("", env) == env
    True
    >>> parse('{"breaker": {"failures": 2}}', env)
    FallbackSettings(faq=(), failures=2, reset_s=5.0)
    >>> parse('{"faq": [{"keywords": ["refund"], "answer": "5 days"}]}', env).faq
    (FaqEntry(keywords=('refund',), answer='5 days'),)
    >>> parse('{"breaker": {"resetSeconds": "5"}}', env)
    Traceback (most recent call last):
    ...
    ValueError: breaker.resetSeconds: must be a number above 0
    """
    if not text.strip():
        return defaults
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    faq = defaults.faq if data.get("faq") is None else faq_entries(data["faq"])
    breaker = data.get("breaker")
    if breaker is None:
        breaker = {}
    if not isinstance(breaker, dict):
        raise ValueError("breaker: must be an object")
    failures = breaker.get("failures")
    if failures is None:
        failures = defaults.failures
    elif not (isinstance(failures, int) and not isinstance(failures, bool) and failures >= 1):
        raise ValueError("breaker.failures: must be an integer of at least 1")
    reset_s = breaker.get("resetSeconds")
    if reset_s is None:
        reset_s = defaults.reset_s
    elif not (_is_number(reset_s) and reset_s > 0):
        raise ValueError("breaker.resetSeconds: must be a number above 0")
    return FallbackSettings(faq, failures, float(reset_s))


class LiveSettings:
    """Polls the fallback file and applies each new content to the pipeline's fallback and breaker.

    ``defaults`` are the environment's settings (what an absent key or an empty file means);
    ``on_result`` is told ``"applied"`` or ``"invalid"`` once per new content (the metric)."""

    def __init__(
        self,
        path: str | Path,
        defaults: FallbackSettings,
        fallback: Fallback,
        breaker: CircuitBreaker,
        on_result: Callable[[str], None] | None = None,
    ):
        self.path = Path(path)
        self.defaults = defaults
        self.fallback = fallback
        self.breaker = breaker
        self.on_result = on_result
        self._seen: bytes | None = None
        """The content last read (applied or not); None before the first poll."""
        self.current = defaults
        """The settings in force: the last good content's."""

    def read(self) -> bytes:
        """The file's content; a file that cannot be read (missing) is empty."""
        try:
            return self.path.read_bytes()
        except OSError:
            return b""

    def poll(self) -> str | None:
        """Read the file; apply a content not seen before. ``"applied"``, ``"invalid"``, or None when the
        content is the last one seen (nothing done)."""
        raw = self.read()
        if raw == self._seen:
            return None
        self._seen = raw
        try:
            settings = parse(raw.decode("utf-8"), self.defaults)
        except (UnicodeDecodeError, ValueError) as exc:
            log.warning("%s: not applied, keeping the last good fallback settings: %s", self.path, exc)
            return self._tell(INVALID)
        self.fallback.replace_faq(settings.faq)
        self.breaker.configure(settings.failures, settings.reset_s)
        self.current = settings
        log.info(
            "%s: applied: %d FAQ entries, breaker failures %d, reset %.3g s%s",
            self.path,
            len(settings.faq),
            settings.failures,
            settings.reset_s,
            "" if raw.strip() else " (empty: the environment's settings)",
        )
        return self._tell(APPLIED)

    def _tell(self, result: str) -> str:
        if self.on_result is not None:
            self.on_result(result)
        return result

    async def watch(self, interval_s: float) -> None:
        """Poll every ``interval_s`` until cancelled (the caller polled once before serving)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.poll()
            except Exception:  # a poller that stops would leave the pod on old settings for good
                log.exception("%s: poll failed", self.path)
