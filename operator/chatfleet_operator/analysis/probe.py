"""Bounded probe load: when the canary has no traffic and the spec asks, send a few test prompts to it.

No data is inconclusive, never a pass; with spec.analysis.probe the operator makes data instead of
waiting: at most `requests` chat completions per interval, each with a short timeout, the whole burst
within `budget_seconds`. The answers themselves are not judged here -- they are counted by the pods'
own metrics, which the next measurement reads like any other traffic.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger("chatfleet.analysis")

DEFAULT_PROMPTS = ("Hello! What can you do?", "Summarize our refund policy in one sentence.")


@dataclass(frozen=True)
class ProbeResult:
    """How a burst went."""

    sent: int
    failed: int
    seconds: float


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Refuse redirects: the checked URL is the only one called (a 3xx would lead anywhere)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        """Never follow: the 3xx answer stands as an HTTPError."""
        return None


#: An opener that never follows a redirect (the probe and the quality gate call only the URL they chose).
OPENER = urllib.request.build_opener(_NoRedirects)


def send_probe(
    url: str,
    model: str,
    *,
    requests: int = 10,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    timeout_seconds: float = 5.0,
    budget_seconds: float = 10.0,
    max_tokens: int = 16,
) -> ProbeResult:
    """Send at most `requests` prompts within `budget_seconds`; never raises."""
    started = time.monotonic()
    sent = failed = 0
    for i in range(max(0, requests)):
        if time.monotonic() - started > budget_seconds:
            break
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompts[i % len(prompts)] if prompts else "ping"}],
            "max_tokens": max_tokens,
            "user": f"chatfleet-probe-{i}",
        }
        req = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-Chatfleet-Probe": "true"},
            method="POST",
        )
        sent += 1
        try:
            with OPENER.open(req, timeout=timeout_seconds) as r:
                r.read()
        except Exception:  # a failed probe is data for the metrics, not an operator error
            failed += 1
    result = ProbeResult(sent, failed, time.monotonic() - started)
    log.info("Sent %d probe requests to %s (%d failed) in %.1fs", sent, url, failed, result.seconds)
    return result
