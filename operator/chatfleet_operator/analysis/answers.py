"""Ask one track's chat API the golden prompts, one at a time: the quality gate's only I/O. Never raises.

Also the shadow phase's: the records taken from a canary pod's shadow port, and the same messages asked
of a stable pod (`take_records`, `ask_records`).

Each prompt is one non-streamed chat completion (greedy, fixed seed: quality.request_body) to one Ready
pod of the track, so the answers of two intervals, and of two tracks of the same model, are comparable.
The whole round is bounded: `budget_seconds` over all prompts, `timeout_seconds` each. A prompt that
got no answer carries why (the refused connection, the HTTP status, the time-out): the scorer counts it
as the canary's failure to answer, or leaves it out for stable.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Sequence

from chatfleet_operator.analysis import shadow
from chatfleet_operator.analysis.probe import OPENER
from chatfleet_operator.analysis.quality import Answer, GoldenPrompt, request_body

log = logging.getLogger("chatfleet.analysis")

#: Requests of the quality gate carry this header, so a pod's logs and a mesh can tell them apart.
HEADER = "X-Chatfleet-Quality"


def answer_text(body: bytes) -> str:
    """The assistant's text of an OpenAI chat completion (ValueError when the body is not one, or is the
    runtime's fallback: the FAQ or fallback text the pod gives when its model cannot answer)."""
    data = json.loads(body)
    if isinstance(data, dict) and (data.get("chatfleet") or {}).get("fallback"):
        raise ValueError("a fallback answer, not the model's")
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no choices[0].message.content in the answer ({exc!r})") from exc
    return "" if content is None else str(content)


def error_text(exc: urllib.error.HTTPError) -> str:
    """The chat API's error message of a refused prompt (OpenAI's error.message), short; '' if none."""
    try:
        data = json.loads(exc.read() or b"{}")
        message = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
    except (ValueError, OSError, AttributeError):
        message = None
    return str(message or "")[:160]


def ask_all(
    url: str,
    model: str,
    prompts: Sequence[GoldenPrompt],
    *,
    max_tokens: int,
    seed: int,
    timeout_seconds: float = 10.0,
    budget_seconds: float = 30.0,
) -> list[Answer]:
    """One Answer per prompt, in order; past the budget the rest are answered 'not asked (budget)'."""
    started = time.monotonic()
    out: list[Answer] = []
    for p in prompts:
        if time.monotonic() - started > budget_seconds:
            out.append(Answer(None, f"not asked: the round's {budget_seconds:.0f}s budget was spent"))
            continue
        body = request_body(model, p.prompt, max_tokens=max_tokens, seed=seed)
        out.append(_ask(url, body, timeout_seconds))
    answered = sum(a.text is not None for a in out)
    log.info(
        "Asked %s %d golden prompts (%d answered) in %.1fs",
        url,
        len(out),
        answered,
        time.monotonic() - started,
    )
    return out


def _ask(url: str, body: dict, timeout_seconds: float) -> Answer:
    """One non-streamed chat completion: the answer's text, or why there is none."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", HEADER: "true"},
        method="POST",
    )
    try:
        with OPENER.open(req, timeout=timeout_seconds) as r:
            return Answer(answer_text(r.read()))
    except urllib.error.HTTPError as exc:
        return Answer(None, f"HTTP {exc.code}: {error_text(exc)}")
    except Exception as exc:  # an unanswered prompt is data for the scorer, not an operator error
        return Answer(None, f"{type(exc).__name__}: {str(exc)[:120]}")


def take_records(url: str, timeout_seconds: float = 5.0) -> tuple[list[shadow.Record], int, str | None]:
    """The records a canary pod's shadow port holds (taken: the pod forgets them), how many it lost to its
    bound, and why there are none when the pod did not answer."""
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with OPENER.open(req, timeout=timeout_seconds) as r:
            records, overflowed = shadow.records_of(json.loads(r.read() or b"{}"))
            return records, overflowed, None
    except Exception as exc:  # a pod that does not answer gives no records this interval
        return [], 0, f"{url}: {type(exc).__name__}: {str(exc)[:120]}"


def ask_records(
    url: str,
    model: str,
    records: Sequence[shadow.Record],
    *,
    seed: int,
    timeout_seconds: float = 10.0,
    budget_seconds: float = 30.0,
) -> list[Answer]:
    """Stable's answer to each record's messages, in order; past the budget the rest are 'not asked'."""
    started = time.monotonic()
    out = []
    for r in records:
        if time.monotonic() - started > budget_seconds:
            out.append(Answer(None, f"not asked: the round's {budget_seconds:.0f}s budget was spent"))
            continue
        out.append(_ask(url, shadow.request_body(model, r, seed), timeout_seconds))
    log.info("Asked %s %d mirrored requests in %.1fs", url, len(out), time.monotonic() - started)
    return out
