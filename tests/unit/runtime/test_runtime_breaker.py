"""Circuit breaker transitions (injected clock) and FAQ / fallback selection."""

from __future__ import annotations

import json

import pytest
from chatfleet_runtime.chat.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, Fallback


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.mark.parametrize(
    ("events", "state"),
    [
        pytest.param([], CLOSED, id="fresh"),
        pytest.param(["fail", "fail"], CLOSED, id="below-threshold"),
        pytest.param(["fail", "fail", "fail"], OPEN, id="threshold"),
        pytest.param(["fail", "fail", "ok", "fail", "fail"], CLOSED, id="success-resets-count"),
        pytest.param(["fail"] * 3 + ["wait"], HALF_OPEN, id="reset-timeout"),
        pytest.param(["fail"] * 3 + ["wait", "probe", "ok"], CLOSED, id="probe-ok-closes"),
        pytest.param(["fail"] * 3 + ["wait", "probe", "fail"], OPEN, id="probe-fail-reopens"),
    ],
)
def test_transitions(events, state):
    clock = Clock()
    changes = []
    b = CircuitBreaker(
        failure_threshold=3, reset_timeout_s=5, clock=clock, on_change=lambda a, z: changes.append(z)
    )
    for event in events:
        if event == "fail":
            b.record_failure()
        elif event == "ok":
            b.record_success()
        elif event == "wait":
            clock.t += 5
        elif event == "probe":
            assert b.allow()
    assert b.state == state
    assert (changes[-1] if changes else CLOSED) == state


def test_open_rejects_and_half_open_admits_one_probe():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, reset_timeout_s=2, clock=clock)
    b.record_failure()
    assert not b.allow()
    clock.t = 2
    assert b.allow() and not b.allow()
    b.release()  # the probe's client left without a verdict
    assert b.allow()


FAQ = json.dumps(
    [
        {"keywords": ["refund", "money"], "answer": "Refunds take 5 days."},
        {"question": "What are your opening hours?", "answer": "9 to 5."},
    ]
)


@pytest.mark.parametrize(
    ("text", "answer", "source"),
    [
        pytest.param("I want my money back, a refund!", "Refunds take 5 days.", "faq", id="keywords"),
        pytest.param("when are your opening hours", "9 to 5.", "faq", id="question-words"),
        pytest.param("tell me a joke", "busy", "text", id="no-match"),
    ],
)
def test_fallback_answers(text, answer, source):
    fb = Fallback.from_config("busy", FAQ)
    assert fb.answer([{"role": "system", "content": "x"}, {"role": "user", "content": text}]) == (
        answer,
        source,
    )


def test_faq_from_yaml_file(tmp_path):
    path = tmp_path / "faq.yaml"
    path.write_text("- keywords: [password]\n  answer: Use the reset link.\n")
    assert (
        Fallback.from_config("busy", str(path)).answer([{"role": "user", "content": "lost password"}])[1]
        == "faq"
    )


def test_faq_entry_needs_an_answer():
    with pytest.raises(ValueError, match=r"faq\[0\]: needs an answer"):
        Fallback.from_config("busy", '[{"keywords": ["x"]}]')
