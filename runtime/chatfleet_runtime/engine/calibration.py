"""int8 checked before the replica serves: calibration prompts, the agreement measure, the failure report.

Agreement (docs/runtime.md "Precision"): every calibration prompt is rendered through the chat template
(one user message, generation prompt added) and run once, teacher-forced, through the full-precision model
and through the int8 model. At every position of every prompt each model predicts the next token
(argmax of its logits); the agreement is the fraction of those positions where the two predictions are the
same token. 0.98 means the int8 model's greedy choice differs from the full-precision one at 2 % of the
positions. Ties and sampling play no part: it is the greedy next token, position by position.

Pure parts (unit-tested): ``read_prompts``, ``agreement``, ``failure_message``, ``parse_failure``. The model
work is ``reference_predictions`` / ``measure``. A failure is reported through the termination message
(``engine.termination``), where the operator reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Fallback calibration set, used only when the spec gives none: short, varied questions (how-to,
#: factual, arithmetic, code, advice, small talk). Real traffic should be given instead.
BUILTIN_PROMPTS: tuple[str, ...] = (
    "How do I reset my password?",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain in two sentences how a Kubernetes Deployment rolls out a new version.",
    "What is 17 times 23? Show the steps.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "My order arrived damaged. What should I do?",
    "Summarise the difference between TCP and UDP for a beginner.",
    "Give me three ideas for a rainy Sunday afternoon.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Hi! Who are you and what can you help me with?",
    "Is it safe to run a database on a spot instance? Answer briefly.",
    "What are the symptoms of dehydration?",
)

#: Default agreement an int8 model must reach (a loss under 2 % of next-token choices).
DEFAULT_MIN_AGREEMENT = 0.98
#: First words of the failure message; the operator's diagnosis matches on them.
FAILURE_PREFIX = "precision check failed:"
_FAILURE = re.compile(
    r"precision check failed: int8 agreement (?P<agreement>[0-9.]+) < (?P<threshold>[0-9.]+)"
)


class PrecisionCheckFailed(RuntimeError):
    """The int8 model disagreed with the full-precision one too often; the replica must not serve."""


@dataclass(frozen=True)
class Agreement:
    """The measured agreement: positions where both models chose the same next token, of all positions."""

    same: int
    positions: int
    prompts: int
    source: str

    @property
    def ratio(self) -> float:
        """same / positions (1.0 for no positions: nothing to disagree on).

        >>> Agreement(49, 50, 3, "builtin").ratio
        0.98
        """
        return self.same / self.positions if self.positions else 1.0


def read_prompts(inline: str | None, file_path: str | None) -> tuple[list[str], str]:
    """(prompts, where they came from): the inline JSON list, else the mounted file, else the built-in set.

    The file (a ConfigMap key) holds a JSON list of strings, or one prompt per line (blank lines skipped).
    A named file that is missing or empty is an error: the spec asked for it.
    >>> read_prompts('["a", "b"]', None)
    (['a', 'b'], 'spec.runtime.calibration.prompts (2)')
    >>> read_prompts(None, None)[1]
    'built-in fallback set (12)'
    """
    if inline:
        prompts = _as_list(inline, "the calibration_prompts parameter")
        return prompts, f"spec.runtime.calibration.prompts ({len(prompts)})"
    if file_path:
        path = Path(file_path)
        if not path.is_file():
            raise PrecisionCheckFailed(
                f"int8 calibration file {file_path} is missing (the ConfigMap of "
                "spec.runtime.calibration.configMapRef does not exist or has no such key)"
            )
        text = path.read_text(encoding="utf-8")
        try:
            prompts = _as_list(text, file_path) if text.lstrip().startswith("[") else None
        except ValueError:
            prompts = None
        if prompts is None:
            prompts = [line.strip() for line in text.splitlines() if line.strip()]
        if not prompts:
            raise PrecisionCheckFailed(f"int8 calibration file {file_path} holds no prompts")
        return prompts, f"spec.runtime.calibration.configMapRef ({len(prompts)})"
    return list(BUILTIN_PROMPTS), f"built-in fallback set ({len(BUILTIN_PROMPTS)})"


def _as_list(text: str, where: str) -> list[str]:
    """A JSON list of non-empty strings."""
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value) or not value:
        raise ValueError(f"{where}: expected a non-empty JSON list of non-empty strings")
    return list(value)


def agreement(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(same, positions): per prompt, the next-token predictions of both models compared position by position.

    >>> agreement([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]])
    (4, 5)
    """
    same = positions = 0
    for ref, cand in zip(reference, candidate, strict=True):
        if len(ref) != len(cand):
            raise ValueError(f"prediction lengths differ: {len(ref)} != {len(cand)}")
        same += sum(int(a == b) for a, b in zip(ref, cand, strict=True))
        positions += len(ref)
    return same, positions


def failure_message(measured: Agreement, threshold: float) -> str:
    """The termination message of a failed check (at most a few hundred bytes; the kubelet keeps 4 KiB).

    >>> failure_message(Agreement(93, 100, 12, "built-in fallback set (12)"), 0.98)
    'precision check failed: int8 agreement 0.930 < 0.980 (93/100 next-token positions, 12 prompts from built-in fallback set (12)); not serving'
    """
    return (
        f"{FAILURE_PREFIX} int8 agreement {measured.ratio:.3f} < {threshold:.3f} "
        f"({measured.same}/{measured.positions} next-token positions, {measured.prompts} prompts from "
        f"{measured.source}); not serving"
    )


def parse_failure(message: str) -> tuple[float, float] | None:
    """(agreement, threshold) of a failure message; None for any other message.

    >>> parse_failure("precision check failed: int8 agreement 0.930 < 0.980 (93/100 ...)")
    (0.93, 0.98)
    """
    found = _FAILURE.search(message or "")
    return (float(found["agreement"]), float(found["threshold"])) if found else None


def prompt_ids(tokenizer, prompts: Iterable[str], max_tokens: int = 256) -> list[list[int]]:
    """Each prompt rendered as one user message through the chat template, at most max_tokens ids."""
    out = []
    for text in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        out.append(list(ids)[:max_tokens])
    return out


def predictions(model, ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """The model's greedy next token at every position of each prompt (one teacher-forced forward each)."""
    import torch

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    out = []
    with torch.inference_mode():
        for row in ids:
            logits = model(input_ids=torch.tensor([list(row)], dtype=torch.long, device=device)).logits
            out.append(logits[0].float().argmax(dim=-1).tolist())
    return out


def measure(
    reference: Sequence[Sequence[int]], model, ids: Sequence[Sequence[int]], source: str
) -> Agreement:
    """The int8 model's agreement with the reference predictions on the same prompt ids."""
    same, positions = agreement(reference, predictions(model, ids))
    return Agreement(same, positions, len(ids), source)
