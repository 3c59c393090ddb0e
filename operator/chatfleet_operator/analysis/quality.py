"""Answer quality, judged from the answers themselves: golden prompts sent to the canary and to stable.

Pure: the answers come in, figures come out, in the shape of the other analysis metrics (a Sample keyed
by check name), so the same assessor, failure counting and rollback order apply. Nothing here sends a
request or reads the spec (the ConfigMap's prompts come in as text: `prompts_from_text`).

The figures, per interval, over the golden prompts both tracks answered:

- agreement: the mean normalised similarity of the canary's answer to stable's (rapidfuzz's
  Indel ratio on case-folded, whitespace-collapsed text), in %. A release that changes nothing that can
  change answers (resources, replicas, batching) answers greedy prompts identically: 100 %.
- expectations passed: the share of the prompts' expectations (contains, regex, not refusing, a maximum
  length, valid JSON) the canary's answers meet, in %.
- refusals: the share of answers that refuse ("I'm sorry, but I can't ..."), in %.
- garbled: the share of answers that are empty, mostly unprintable, a loop of one word, or leak the chat
  template's special tokens (what a broken template or a mismatched tokenizer gives), in %.
- length drift: how far the canary's mean answer length is from stable's, in % of stable's.

A prompt stable did not answer is left out (it says nothing about the canary); when stable answered none,
the sample is an Error (counted apart, never a pass and never a rollback), like an unreachable Prometheus.
A prompt the canary did not answer counts as garbled: the canary failed to answer it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import yaml
from rapidfuzz import fuzz

from chatfleet_operator.analysis.assess import Check, Sample
from chatfleet_operator.spec import GoldenExpectation, GoldenPromptSpec, QualitySpec, golden_prompt_of

AGREEMENT, EXPECTATIONS, REFUSALS, GARBLED, LENGTH_DRIFT = (
    "answer agreement",
    "expectations passed",
    "refusals",
    "garbled answers",
    "answer length drift",
)

#: Openings of a refusal, matched case-insensitively at the start of the answer or of a sentence.
REFUSAL_PATTERNS = (
    r"i(?:'m| am) (?:sorry|afraid)[, ]+(?:but )?i (?:can(?:no|')t|cannot|won't|am not able|'m not able)",
    r"i (?:can(?:no|')t|cannot|won't|will not) (?:help|assist|comply|provide|do that|answer)",
    r"i(?:'m| am) (?:not able|unable) to (?:help|assist|comply|provide|answer)",
    r"as an ai(?: language model)?,? i (?:can(?:no|')t|cannot|don't|do not)",
)
_REFUSAL = re.compile(r"(?:^|[.!?]\s+)(?:" + "|".join(REFUSAL_PATTERNS) + ")", re.IGNORECASE)
#: Special tokens of the common chat templates: in an answer they mean the template or tokenizer is off.
TEMPLATE_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|assistant|>",
    "<|user|>",
    "[INST]",
    "[/INST]",
    "<s>",
    "</s>",
)


#: The spec's type of a golden prompt (name, the user's message, `expect`: spec.GoldenExpectation).
GoldenPrompt = GoldenPromptSpec


def unmet(expect: GoldenExpectation, answer: str) -> list[str]:
    """The expectations `answer` misses, each named (empty when it meets them all)."""
    out = [f"contains {c!r}" for c in expect.contains if c.casefold() not in answer.casefold()]
    if expect.regex is not None and not re.search(expect.regex, answer):
        out.append(f"matches /{expect.regex}/")
    if expect.must_not_refuse and refused(answer):
        out.append("does not refuse")
    if expect.max_length is not None and len(answer) > expect.max_length:
        out.append(f"at most {expect.max_length} characters ({len(answer)})")
    if expect.valid_json:
        try:
            json.loads(answer)
        except ValueError:
            out.append("valid JSON")
    return out


def expectation_count(expect: GoldenExpectation) -> int:
    """How many expectations `expect` holds (contains counts once per string)."""
    return (
        len(expect.contains)
        + (expect.regex is not None)
        + expect.must_not_refuse
        + (expect.max_length is not None)
        + expect.valid_json
    )


@dataclass(frozen=True)
class Answer:
    """A track's answer to one golden prompt: its text, or why there is none."""

    text: str | None
    error: str | None = None


@dataclass(frozen=True)
class Score:
    """The quality figures of one interval, and which prompts missed what (for status and events)."""

    canary: Mapping[str, float]
    stable: Mapping[str, float]
    misses: tuple[str, ...] = ()
    error: str | None = None


def normalise(text: str) -> str:
    """Case-folded, whitespace collapsed: what agreement compares."""
    return " ".join(text.casefold().split())


def agreement(a: str, b: str) -> float:
    """Normalised similarity of two answers, 0..1 (1: the same text once normalised)."""
    return fuzz.ratio(normalise(a), normalise(b)) / 100.0


def refused(text: str) -> bool:
    """Whether the answer refuses."""
    return bool(_REFUSAL.search(text.strip()))


def garbled(text: str | None) -> str | None:
    """Why the answer is no answer (None when it reads as text): empty, unprintable, a loop, template tokens."""
    if text is None or not text.strip():
        return "empty"
    leaked = [t for t in TEMPLATE_TOKENS if t in text]
    if leaked:
        return f"chat template tokens {', '.join(leaked)}"
    bad = sum(1 for ch in text if ch == "\ufffd" or (not ch.isprintable() and ch not in "\n\t\r"))
    if bad / len(text) > 0.1:
        return f"{bad} of {len(text)} characters unprintable"
    words = text.split()
    if len(words) >= 12:
        top = max(words.count(w) for w in set(words))
        if top / len(words) > 0.5:
            return "one word repeated over half the answer"
    return None


def request_body(model: str, prompt: str, *, max_tokens: int, seed: int) -> dict:
    """The chat completion a golden prompt is sent as: greedy with a fixed seed, so answers repeat.

    No session id (no `user`, no `session_id`): a session would add the last round's answers to the
    prompt as history, and the same prompt would be asked differently every interval.
    """
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
        "stream": False,
    }


def score(
    prompts: Sequence[GoldenPrompt],
    canary: Sequence[Answer],
    stable: Sequence[Answer],
) -> Score:
    """The interval's figures from both tracks' answers, prompt by prompt (same order as `prompts`)."""
    if not (len(prompts) == len(canary) == len(stable)):
        raise ValueError("one answer per golden prompt and track")
    both = [(p, c, s) for p, c, s in zip(prompts, canary, stable, strict=True) if s.text is not None]
    if not both:
        why = next((s.error for s in stable if s.error), "no answer")
        return Score({}, {}, error=f"stable answered none of the {len(prompts)} golden prompts ({why})")
    misses: list[str] = []
    similar = expected = met = met_s = refusals_c = refusals_s = garbled_c = garbled_s = 0.0
    len_c = len_s = 0
    for p, c, s in both:
        text_c, text_s = c.text or "", s.text or ""
        why_c = garbled(c.text) if c.error is None else f"no answer ({c.error})"
        if why_c:
            garbled_c += 1
            misses.append(f"{p.name}: {why_c}")
        garbled_s += garbled(text_s) is not None
        refusals_c += refused(text_c)
        refusals_s += refused(text_s)
        similar += agreement(text_c, text_s)
        count = expectation_count(p.expect)
        expected += count
        failed = unmet(p.expect, text_c)
        met += count - len(failed)
        met_s += count - len(unmet(p.expect, text_s))
        misses += [f"{p.name}: {f}" for f in failed]
        len_c += len(text_c)
        len_s += len(text_s)
    n = len(both)
    drift = abs(len_c - len_s) / max(len_s, 1) * 100.0
    canary_figures = {
        AGREEMENT: similar / n * 100.0,
        REFUSALS: refusals_c / n * 100.0,
        GARBLED: garbled_c / n * 100.0,
        LENGTH_DRIFT: drift,
    }
    stable_figures = {REFUSALS: refusals_s / n * 100.0, GARBLED: garbled_s / n * 100.0}
    if expected:
        canary_figures[EXPECTATIONS] = met / expected * 100.0
        stable_figures[EXPECTATIONS] = met_s / expected * 100.0
    return Score(canary_figures, stable_figures, tuple(misses))


def to_sample(result: Score, at: datetime, prompts_sent: int) -> Sample:
    """The score as an analysis Sample: the golden prompts are the canary's traffic for this check."""
    if result.error is not None:
        return Sample(at, error=result.error)
    return Sample(
        at,
        canary_requests_per_second=float(prompts_sent),
        canary=dict(result.canary),
        stable=dict(result.stable),
        window_seconds=1.0,
    )


def checks(
    *,
    min_agreement_percent: float | None = 100.0,
    min_expectations_percent: float = 100.0,
    max_refusal_increase_percent: float = 0.0,
    max_garbled_increase_percent: float = 0.0,
    max_length_drift_percent: float | None = 50.0,
) -> tuple[Check, ...]:
    """The quality gates; None leaves a figure unchecked (agreement for a release meant to change answers).

    Refusals and garbled answers are judged against stable's on the same prompts: a small model can
    garble some answers of every revision, and only a change from stable's is the release's doing.
    """
    out = []
    if min_agreement_percent is not None:
        out.append(Check(AGREEMENT, "%", min_value=min_agreement_percent))
    out.append(Check(EXPECTATIONS, "%", min_value=min_expectations_percent))
    out.append(Check(REFUSALS, "%", max_increase_over_stable=max_refusal_increase_percent))
    out.append(Check(GARBLED, "%", max_increase_over_stable=max_garbled_increase_percent))
    if max_length_drift_percent is not None:
        out.append(Check(LENGTH_DRIFT, "%", max_value=max_length_drift_percent))
    return tuple(out)


def checks_of(spec: QualitySpec) -> tuple[Check, ...]:
    """The gates spec.analysis.quality asks for (agreement left out when compareWithStable is false)."""
    return checks(
        min_agreement_percent=spec.min_agreement_percent if spec.compare_with_stable else None,
        min_expectations_percent=spec.min_expectations_percent,
        max_refusal_increase_percent=spec.max_refusal_increase_percent,
        max_garbled_increase_percent=spec.max_garbled_increase_percent,
        max_length_drift_percent=spec.max_length_drift_percent,
    )


def spec_errors(spec: QualitySpec) -> list[str]:
    """What admission cannot check of spec.analysis.quality (a regex in Python's syntax), each naming its
    field; [] if fine. e.g. regex "(" -> "spec.analysis.quality.prompts[0].expect.regex: ..."."""
    return _regex_errors(spec.prompts, "spec.analysis.quality.prompts")


def _regex_errors(prompts: Sequence[GoldenPromptSpec], where: str) -> list[str]:
    """One message per expect.regex that Python cannot compile."""
    out = []
    for i, p in enumerate(prompts):
        if p.expect.regex is None:
            continue
        try:
            re.compile(p.expect.regex)
        except re.error as exc:
            out.append(f"{where}[{i}].expect.regex is not a valid regular expression: {exc}")
    return out


#: What a prompt from a ConfigMap may hold: the schema of spec.analysis.quality.prompts[] (admission
#: checks the inline ones; these are checked here, at each measurement, with the same limits).
MAX_PROMPTS = 20
_PROMPT_KEYS = {"name", "prompt", "expect"}
_EXPECT_TYPES: dict[str, type] = {
    "contains": list,
    "regex": str,
    "mustNotRefuse": bool,
    "maxLength": int,
    "validJSON": bool,
}


def prompts_from_text(
    text: str, where: str, inline: Sequence[GoldenPromptSpec] = ()
) -> tuple[tuple[GoldenPromptSpec, ...], list[str]]:
    """The golden prompts a ConfigMap key holds (a YAML or JSON list in the shape of
    spec.analysis.quality.prompts), and what is wrong with them, each message starting with `where`
    (e.g. "spec.analysis.quality.promptsFrom (ConfigMap 'golden', key 'prompts.yaml')[2].prompt is
    missing"). Any error: no prompts (a half-read set would judge the release on other prompts)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return (), [f"{where} is not YAML or JSON: {' '.join(str(exc).split())[:200]}"]
    if not isinstance(data, list) or not data:
        return (), [f"{where} must be a non-empty list of prompts, each {{name, prompt, expect}}"]
    errors = [f"{where} has {len(data)} prompts, at most {MAX_PROMPTS}"] if len(data) > MAX_PROMPTS else []
    names = {p.name for p in inline}
    for i, item in enumerate(data):
        errors += _item_errors(item, f"{where}[{i}]", names)
    prompts = tuple(g for item in data if (g := golden_prompt_of(item)) is not None)
    errors += _regex_errors(prompts, where) if not errors else []
    return ((), errors) if errors else (prompts, [])


def _item_errors(item: object, at: str, names: set[str]) -> list[str]:
    """What is wrong with one prompt from a ConfigMap (adds its name to `names`)."""
    if not isinstance(item, Mapping):
        return [f"{at} must be a mapping with name and prompt"]
    out = [f"{at}.{k} is not a field of a golden prompt" for k in sorted(set(item) - _PROMPT_KEYS)]
    for key, limit in (("name", 63), ("prompt", 4096)):
        value = item.get(key)
        if not isinstance(value, str) or not value:
            out.append(f"{at}.{key} is missing (a non-empty string)")
        elif len(value) > limit:
            out.append(f"{at}.{key} is longer than {limit} characters")
    name = item.get("name")
    if isinstance(name, str) and name:
        if name in names:
            out.append(f"{at}.name {name!r} is not unique")
        names.add(name)
    expect = item.get("expect", {})
    if not isinstance(expect, Mapping):
        return [*out, f"{at}.expect must be a mapping"]
    for k, v in expect.items():
        want = _EXPECT_TYPES.get(k)
        if want is None:
            out.append(f"{at}.expect.{k} is not an expectation ({', '.join(_EXPECT_TYPES)})")
        elif not isinstance(v, want) or (want is int and isinstance(v, bool)):
            out.append(f"{at}.expect.{k} must be a {_type_name(want)}")
        elif k == "contains" and not all(isinstance(c, str) and c for c in v):
            out.append(f"{at}.expect.contains must be a list of non-empty strings")
        elif k == "maxLength" and v < 1:
            out.append(f"{at}.expect.maxLength must be at least 1")
    return out


def _type_name(t: type) -> str:
    """'list', 'str', ... as a user reads it."""
    return {list: "list", str: "string", bool: "boolean", int: "integer"}.get(t, t.__name__)
