"""Answer-quality figures from golden prompts' answers (pure: answers in, analysis figures out)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from chatfleet_operator.analysis import quality
from chatfleet_operator.analysis.assess import ERROR, FAILED, SUCCESSFUL, assess
from chatfleet_operator.analysis.quality import Answer, GoldenPrompt
from chatfleet_operator.spec import GoldenExpectation as Expectation

NOW = datetime(2026, 11, 25, tzinfo=UTC)
PROMPTS = (
    GoldenPrompt("greet", "Say hello.", Expectation(contains=("hello",), must_not_refuse=True)),
    GoldenPrompt("json", 'Give {"ok": true} as JSON.', Expectation(valid_json=True, max_length=40)),
    GoldenPrompt("sum", "What is 2+2?", Expectation(regex=r"\b4\b")),
)
STABLE = (
    Answer("Hello! How can I help you today?"),
    Answer('{"ok": true}'),
    Answer("2+2 is 4."),
)


def verdict(canary, stable=STABLE, **gates):
    s = quality.score(PROMPTS, canary, stable)
    return s, assess(quality.to_sample(s, NOW, len(PROMPTS)), quality.checks(**gates))


def test_the_same_model_agrees_fully_and_passes():
    s, m = verdict(STABLE)
    assert s.canary[quality.AGREEMENT] == 100.0 and s.canary[quality.EXPECTATIONS] == 100.0
    assert s.canary[quality.GARBLED] == 0.0 and s.canary[quality.LENGTH_DRIFT] == 0.0
    assert m.verdict == SUCCESSFUL, m.message


def test_agreement_ignores_case_and_spacing_only():
    assert quality.agreement("Hello,  World\n", "hello, world") == 1.0
    assert 0.0 < quality.agreement("Hello, world", "Hello, there") < 1.0


def test_a_broken_chat_template_fails_on_quality_with_perfect_http():
    leaked = tuple(Answer(f"<|im_start|>assistant\n{a.text}<|im_end|>") for a in STABLE)
    s, m = verdict(leaked)
    assert s.canary[quality.GARBLED] == 100.0
    assert m.verdict == FAILED and "garbled answers 100%" in m.message, m.message
    assert any("chat template tokens" in miss for miss in s.misses)


def test_different_weights_fail_agreement_and_expectations_but_may_skip_agreement():
    other = (Answer("Greetings, traveller."), Answer("ok: yes"), Answer("Four, I think."))
    s, m = verdict(other)
    assert s.canary[quality.AGREEMENT] < 60 and s.canary[quality.EXPECTATIONS] < 50
    assert set(m.failed_metrics) >= {quality.AGREEMENT, quality.EXPECTATIONS}
    # a release meant to change answers: agreement unchecked, the expectations still gate it
    _, m2 = verdict(other, min_agreement_percent=None)
    assert quality.AGREEMENT not in m2.failed_metrics and quality.EXPECTATIONS in m2.failed_metrics
    misses = set(s.misses)
    assert {"greet: contains 'hello'", "json: valid JSON", r"sum: matches /\b4\b/"} <= misses


def test_refusals_count_against_stables_rate():
    refusing = (Answer("I'm sorry, but I can't help with that."), *STABLE[1:])
    s, m = verdict(refusing)
    assert quality.refused(refusing[0].text)
    assert s.canary[quality.REFUSALS] == pytest.approx(100 / 3) and s.stable[quality.REFUSALS] == 0
    assert quality.REFUSALS in m.failed_metrics and "greet: does not refuse" in s.misses
    assert not quality.refused("Sorry for the wait! The answer is 4.")


def test_a_prompt_the_canary_did_not_answer_is_garbled_and_stable_errors_are_errors():
    s, m = verdict((Answer(None, "HTTP 503"), *STABLE[1:]))
    assert s.canary[quality.GARBLED] == pytest.approx(100 / 3) and m.verdict == FAILED
    assert "greet: no answer (HTTP 503)" in s.misses
    # stable answered nothing: no comparison is possible, an Error (never a pass, never a rollback)
    _, m = verdict(STABLE, stable=(Answer(None, "timed out"),) * 3)
    assert m.verdict == ERROR and "stable answered none of the 3 golden prompts (timed out)" in m.message
    # a prompt stable did not answer is left out
    s, m = verdict(STABLE, stable=(Answer(None, "timed out"), *STABLE[1:]))
    assert m.verdict == SUCCESSFUL and s.canary[quality.AGREEMENT] == 100.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("\ufffd\ufffd\ufffdab", "unprintable"),
        ("the " * 20, "repeated"),
        ("</s> Hello", "chat template tokens </s>"),
    ],
)
def test_garbled_answers_are_named(text, why):
    assert why in (quality.garbled(text) or "")


def test_ordinary_answers_are_not_garbled():
    assert quality.garbled("Our refund policy: full refund within 30 days, no questions asked.") is None


def test_length_drift_is_relative_to_stable():
    long = (Answer(STABLE[0].text * 3), *STABLE[1:])
    s, m = verdict(long)
    assert s.canary[quality.LENGTH_DRIFT] > 50 and quality.LENGTH_DRIFT in m.failed_metrics


def test_golden_prompts_are_sent_greedy_with_a_fixed_seed():
    body = quality.request_body("chat", "Say hello.", max_tokens=32, seed=7)
    assert body["temperature"] == 0 and body["seed"] == 7 and body["stream"] is False
    assert body["messages"] == [{"role": "user", "content": "Say hello."}]
    # no session: the runtime would prepend the last round's answers as history
    assert not {"user", "session_id"} & set(body)


def test_a_fallback_answer_is_no_answer_of_the_model():
    from chatfleet_operator.analysis.answers import answer_text

    ok = {"choices": [{"message": {"role": "assistant", "content": "Hi"}}], "chatfleet": {"fallback": False}}
    assert answer_text(json.dumps(ok).encode()) == "Hi"
    fallback = {**ok, "chatfleet": {"fallback": True}}
    with pytest.raises(ValueError, match="fallback"):
        answer_text(json.dumps(fallback).encode())
    with pytest.raises(ValueError, match="choices"):
        answer_text(b'{"object": "error"}')


def test_one_answer_per_prompt_and_track():
    with pytest.raises(ValueError):
        quality.score(PROMPTS, STABLE[:2], STABLE)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param("a: [", "W is not YAML or JSON", id="not yaml"),
        pytest.param("{name: x, prompt: y}", "W must be a non-empty list of prompts", id="not a list"),
        pytest.param("[]", "W must be a non-empty list of prompts", id="empty"),
        pytest.param("- hello", "W[0] must be a mapping with name and prompt", id="a string"),
        pytest.param("- {name: x}", "W[0].prompt is missing (a non-empty string)", id="no prompt"),
        pytest.param("- {name: hi, prompt: a}", "W[0].name 'hi' is not unique", id="same as inline"),
        pytest.param(
            "- {name: x, prompt: a, expect: {contain: [b]}}",
            "W[0].expect.contain is not an expectation",
            id="typo in expect",
        ),
        pytest.param(
            "- {name: x, prompt: a, expect: {maxLength: '5'}}",
            "W[0].expect.maxLength must be a integer",
            id="wrong type",
        ),
        pytest.param(
            "- {name: x, prompt: a, expect: {regex: '('}}",
            "W[0].expect.regex is not a valid regular expression",
            id="bad regex",
        ),
        pytest.param(
            "\n".join(f"- {{name: p{i}, prompt: a}}" for i in range(21)),
            "W has 21 prompts, at most 20",
            id="too many",
        ),
    ],
)
def test_config_map_prompts_are_checked_like_admission_checks_inline_ones(text, why):
    inline = (GoldenPrompt("hi", "Hello!"),)
    prompts, errors = quality.prompts_from_text(text, "W", inline)
    assert prompts == () and any(e.startswith(why) for e in errors), errors


def test_config_map_prompts_parse_in_the_specs_shape_yaml_or_json():
    text = '[{"name": "refund", "prompt": "Refunds?", "expect": {"contains": ["30 days"], "mustNotRefuse": true}}]'
    prompts, errors = quality.prompts_from_text(text, "W")
    assert errors == [] and prompts == (
        GoldenPrompt("refund", "Refunds?", Expectation(contains=("30 days",), must_not_refuse=True)),
    )
