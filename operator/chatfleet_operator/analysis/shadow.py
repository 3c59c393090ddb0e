"""Shadow traffic, judged from the answers: live requests mirrored to the canary, compared with stable's. Pure.

In a release's shadow phase the gateway mirrors a share of the live chat requests to the canary's shadow
port; the canary answers each greedily (never writing a session history) and keeps a record: the whole
message list the model saw, the max_tokens it used, its answer or why there is none. Each analysis
interval the operator takes the records from every canary pod (`records_of` reads them), asks one stable
pod the same messages with the same max_tokens, greedily (`request_body`), and scores the pairs here with
the golden prompts' scorer (analysis/quality.py): agreement, refusals, garbled answers, length drift --
over every pair compared since the phase began, so a quiet interval does not reset the evidence.

Fewer than spec.analysis.quality.shadow.minRequests pairs: Inconclusive (never a pass). A request stable
did not answer is left out; one the canary did not answer counts as garbled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chatfleet_operator.analysis import quality
from chatfleet_operator.analysis.assess import INCONCLUSIVE, Check, Measurement
from chatfleet_operator.spec import GoldenPromptSpec, QualitySpec

PREFIX = "shadow "
AGREEMENT, REFUSALS, GARBLED, LENGTH_DRIFT = (
    PREFIX + quality.AGREEMENT,
    PREFIX + quality.REFUSALS,
    PREFIX + quality.GARBLED,
    PREFIX + quality.LENGTH_DRIFT,
)
#: Pairs kept per release (the oldest go first): the evidence the phase is judged on.
KEEP = 200


@dataclass(frozen=True)
class Record:
    """One mirrored request as the canary answered it."""

    id: int
    messages: tuple[Mapping[str, Any], ...]
    max_tokens: int
    answer: str | None
    error: str | None = None

    @property
    def label(self) -> str:
        """How messages name it: its id and the start of the last user message."""
        last = next((m.get("content") for m in reversed(self.messages) if m.get("role") == "user"), "")
        text = " ".join(str(last or "").split())
        return f"mirrored request {self.id} ({text[:40]!r})"


def records_of(payload: Any) -> tuple[list[Record], int]:
    """The records of one pod's `POST /shadow/records` answer, and how many it overflowed (lost).

    e.g. {"records": [{"id": 3, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32,
    "answer": "Hello"}], "overflowed": 0} -> ([Record(3, ...)], 0). Malformed entries are left out.
    """
    if not isinstance(payload, Mapping):
        return [], 0
    out = []
    for r in payload.get("records") or ():
        if not isinstance(r, Mapping) or not isinstance(r.get("messages"), list) or not r["messages"]:
            continue
        messages = tuple(m for m in r["messages"] if isinstance(m, Mapping))
        answer, error = r.get("answer"), r.get("error")
        try:
            out.append(
                Record(
                    int(r.get("id") or 0),
                    messages,
                    max(1, int(r.get("max_tokens") or 1)),
                    None if answer is None else str(answer),
                    None if error is None else str(error),
                )
            )
        except (TypeError, ValueError):
            continue
    overflowed = payload.get("overflowed")
    return out, overflowed if isinstance(overflowed, int) and overflowed > 0 else 0


def request_body(model: str, record: Record, seed: int) -> dict[str, Any]:
    """What stable is asked for one record: the same messages and max_tokens, greedy, no session (so
    nothing is written to a history and the answer depends on the messages alone)."""
    return {
        "model": model,
        "messages": [dict(m) for m in record.messages],
        "max_tokens": record.max_tokens,
        "temperature": 0,
        "seed": seed,
        "stream": False,
    }


def canary_answer(record: Record) -> quality.Answer:
    """The canary's answer of a record, as the scorer reads it."""
    return quality.Answer(record.answer, None if record.answer is not None else record.error or "no answer")


def score(pairs: Sequence[tuple[Record, quality.Answer]]) -> quality.Score:
    """The figures over (record, stable's answer) pairs, named with the shadow prefix."""
    prompts = [GoldenPromptSpec(r.label, "mirrored") for r, _ in pairs]
    result = quality.score(prompts, [canary_answer(r) for r, _ in pairs], [s for _, s in pairs])
    rename = {
        k: PREFIX + k for k in (quality.AGREEMENT, quality.REFUSALS, quality.GARBLED, quality.LENGTH_DRIFT)
    }
    return quality.Score(
        {rename[k]: v for k, v in result.canary.items() if k in rename},
        {rename[k]: v for k, v in result.stable.items() if k in rename},
        result.misses,
        result.error,
    )


def checks_of(q: QualitySpec) -> tuple[Check, ...]:
    """The shadow gates: spec.analysis.quality.thresholds but expectations (mirrored requests have none)."""
    out = []
    if q.compare_with_stable:
        out.append(Check(AGREEMENT, "%", min_value=q.min_agreement_percent))
    out.append(Check(REFUSALS, "%", max_increase_over_stable=q.max_refusal_increase_percent))
    out.append(Check(GARBLED, "%", max_increase_over_stable=q.max_garbled_increase_percent))
    if q.max_length_drift_percent is not None:
        out.append(Check(LENGTH_DRIFT, "%", max_value=q.max_length_drift_percent))
    return tuple(out)


def compared(pairs: Sequence[tuple[Record, quality.Answer]]) -> int:
    """Pairs that count: those stable answered."""
    return sum(1 for _, s in pairs if s.text is not None)


def too_few(
    at: datetime, pairs: Sequence[tuple[Record, quality.Answer]], min_requests: int, waiting: int
) -> Measurement | None:
    """Inconclusive while fewer than `min_requests` pairs count; None once enough do."""
    n = compared(pairs)
    if n >= min_requests:
        return None
    return Measurement(
        at,
        INCONCLUSIVE,
        f"shadow: {n} of the {min_requests} mirrored requests needed compared with stable "
        f"({waiting} waiting); no traffic to mirror yet, or too little",
    )
