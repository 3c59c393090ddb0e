"""spec.fallback: what each chat API answers instead of the model, and when its breaker stops asking it.

Outside the revision (builders/common.py REVISION_FIELDS): a change reaches the running pods through the
pod annotation chatfleet.io/fallback (converge/fallback.py plans it), never through a release.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet_operator.spec.fields import field_value, sub_mapping


@dataclass(frozen=True)
class FaqAnswer:
    """One canned answer, chosen by its keywords or, without them, by its question's words."""

    answer: str
    question: str = ""
    keywords: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The entry as the chat API's settings file spells it (fields that are set only)."""
        out: dict[str, Any] = {"answer": self.answer}
        if self.question:
            out["question"] = self.question
        if self.keywords:
            out["keywords"] = list(self.keywords)
        return out


@dataclass(frozen=True)
class FallbackSpec:
    """spec.fallback: the FAQ and the circuit breaker's thresholds (CRD defaults: 3 failures, 5 s)."""

    faq: tuple[FaqAnswer, ...] = ()
    breaker_failures: int = 3
    breaker_reset_seconds: int = 5

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FallbackSpec | None:
        """Parse spec.fallback; None when absent (the pods keep their own defaults)."""
        if not d:
            return None
        breaker = sub_mapping(d, "breaker")
        return cls(
            faq=tuple(
                FaqAnswer(
                    str(e["answer"]),
                    str(field_value(e, "question", "")),
                    tuple(str(k) for k in field_value(e, "keywords", ())),
                )
                for e in field_value(d, "faq", ())
            ),
            breaker_failures=int(field_value(breaker, "failures", 3)),
            breaker_reset_seconds=int(field_value(breaker, "resetSeconds", 5)),
        )

    def annotation(self) -> str:
        """The value of the pods' chatfleet.io/fallback annotation: the chat API's settings file, one
        canonical JSON text (equal specs give equal texts, so a pass compares them as strings).

        e.g. one FAQ entry {question "Opening hours?", answer "9 to 5"}, the default breaker ->
        '{"breaker":{"failures":3,"resetSeconds":5},"faq":[{"answer":"9 to 5","question":"Opening hours?"}]}'
        """
        body = {
            "breaker": {"failures": self.breaker_failures, "resetSeconds": self.breaker_reset_seconds},
            "faq": [e.to_dict() for e in self.faq],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
