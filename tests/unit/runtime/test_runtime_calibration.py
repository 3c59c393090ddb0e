"""The int8 check: calibration prompts (inline, file, built-in), the agreement measure, and a replica that
refuses to serve below the threshold, saying so in its termination message.

Test design: the pure parts are table tests; the service tests load the tiny random model through the
production path (``ChatService``), whose int8 agreement is about 0.96: it passes 0.9 and fails 0.999.
The termination message goes to a temporary file named by CHATFLEET_TERMINATION_LOG.
"""

from __future__ import annotations

import json

import pytest
from chatfleet_runtime.engine import calibration, termination
from chatfleet_runtime.engine.calibration import (
    BUILTIN_PROMPTS,
    Agreement,
    PrecisionCheckFailed,
    agreement,
    failure_message,
    parse_failure,
    read_prompts,
)


@pytest.mark.parametrize(
    ("reference", "candidate", "expected"),
    [
        pytest.param([[1, 2, 3]], [[1, 2, 3]], (3, 3), id="all-agree"),
        pytest.param([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]], (4, 5), id="one-of-five"),
        pytest.param([[1, 2], [3, 4]], [[0, 0], [0, 0]], (0, 4), id="none"),
        pytest.param([], [], (0, 0), id="no-prompts"),
    ],
)
def test_agreement_counts_positions_across_prompts(reference, candidate, expected):
    assert agreement(reference, candidate) == expected


def test_agreement_refuses_predictions_of_different_lengths():
    with pytest.raises(ValueError, match="lengths differ"):
        agreement([[1, 2]], [[1]])


@pytest.mark.parametrize(
    ("same", "positions", "ratio"),
    [(49, 50, 0.98), (0, 10, 0.0), (0, 0, 1.0), (333, 345, 333 / 345)],
)
def test_ratio(same, positions, ratio):
    assert Agreement(same, positions, 1, "x").ratio == pytest.approx(ratio)


def test_failure_message_round_trips_agreement_and_threshold():
    message = failure_message(Agreement(93, 100, 12, "built-in fallback set (12)"), 0.98)
    assert message.startswith(calibration.FAILURE_PREFIX)
    assert "int8 agreement 0.930 < 0.980" in message and "93/100" in message
    assert parse_failure(message) == (0.93, 0.98)
    assert parse_failure("tritonserver exited") is None


def test_prompts_inline_file_and_builtin(tmp_path):
    as_json = tmp_path / "json"
    as_json.write_text(json.dumps(["What is up?", "Line\nbreak"]))
    as_lines = tmp_path / "lines"
    as_lines.write_text("How do I pay?\n\n  Where is my order?  \n")
    assert read_prompts('["a", "b"]', str(as_json)) == (
        ["a", "b"],
        "spec.runtime.calibration.prompts (2)",
    )
    assert read_prompts(None, str(as_json))[0] == ["What is up?", "Line\nbreak"]
    assert read_prompts(None, str(as_lines)) == (
        ["How do I pay?", "Where is my order?"],
        "spec.runtime.calibration.configMapRef (2)",
    )
    prompts, source = read_prompts(None, None)
    assert prompts == list(BUILTIN_PROMPTS) and source.startswith("built-in fallback set")
    assert len(set(BUILTIN_PROMPTS)) >= 10


@pytest.mark.parametrize(
    ("inline", "content", "match"),
    [
        pytest.param(None, None, "is missing", id="missing-file"),
        pytest.param(None, "\n \n", "holds no prompts", id="empty-file"),
        pytest.param("[]", None, "non-empty JSON list", id="empty-inline"),
        pytest.param('["ok", ""]', None, "non-empty JSON list", id="empty-prompt"),
    ],
)
def test_bad_prompts_are_refused(tmp_path, inline, content, match):
    path = tmp_path / "prompts"
    if content is not None:
        path.write_text(content)
    with pytest.raises((PrecisionCheckFailed, ValueError), match=match):
        read_prompts(inline, str(path))


def test_termination_message_is_not_written_off_pod(tmp_path, monkeypatch):
    monkeypatch.delenv(termination.TERMINATION_LOG_ENV, raising=False)
    monkeypatch.setattr(termination, "TERMINATION_LOG", str(tmp_path / "absent"))
    assert termination.write_termination_message("x") is None
    assert not (tmp_path / "absent").exists()


def _settings(model_dir, **fields):
    from chatfleet_runtime.engine.service import ServiceSettings

    return ServiceSettings(
        model_dir=str(model_dir), tokenizer_dir=str(model_dir), precision="int8", warmup=False, **fields
    )


def test_int8_below_the_threshold_does_not_serve_and_says_the_agreement(
    tiny_model_dir, tmp_path, monkeypatch
):
    from chatfleet_runtime.engine.service import ChatService

    log = tmp_path / "termination-log"
    monkeypatch.setenv(termination.TERMINATION_LOG_ENV, str(log))
    prompts = ["How do I reset my password?", "What is 2 + 2?", "Write a haiku about rain."]
    with pytest.raises(PrecisionCheckFailed) as failed:
        ChatService(
            _settings(tiny_model_dir, calibration_prompts=json.dumps(prompts), int8_min_agreement=0.999)
        )
    message = log.read_text()
    assert message == str(failed.value)
    measured, threshold = parse_failure(message)
    assert threshold == 0.999 and 0.5 < measured < 0.999, message
    assert "3 prompts from spec.runtime.calibration.prompts (3)" in message


def test_int8_at_or_over_the_threshold_serves(tiny_model_dir, tmp_path, monkeypatch):
    from chatfleet_runtime.engine.service import ChatService

    log = tmp_path / "termination-log"
    monkeypatch.setenv(termination.TERMINATION_LOG_ENV, str(log))
    prompts = tmp_path / "prompts"
    prompts.write_text("How do I reset my password?\nWhat is 2 + 2?\n")
    service = ChatService(_settings(tiny_model_dir, calibration_file=str(prompts), int8_min_agreement=0.5))
    check = service.precision_check
    assert check.prompts == 2 and check.ratio >= 0.5 and check.source.startswith("spec.runtime.calibration")
    assert not log.exists()


def test_a_missing_calibration_file_is_reported_like_a_failed_check(tiny_model_dir, tmp_path, monkeypatch):
    from chatfleet_runtime.engine.service import ChatService

    log = tmp_path / "termination-log"
    monkeypatch.setenv(termination.TERMINATION_LOG_ENV, str(log))
    with pytest.raises(PrecisionCheckFailed):
        ChatService(_settings(tiny_model_dir, calibration_file=str(tmp_path / "none")))
    assert log.read_text().startswith(f"{calibration.FAILURE_PREFIX} int8 calibration file")
