"""Message, parameter and session-id validation; prompt rendering and truncation."""

from __future__ import annotations

import pytest
from chatfleet_runtime.prompting import (
    RequestError,
    SamplingParams,
    parse_sampling,
    render_prompt,
    validate_messages,
    validate_session_id,
)

U = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        pytest.param([U], None, id="one-user"),
        pytest.param([{"role": "system", "content": "be nice"}, U], None, id="system-user"),
        pytest.param(
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], None, id="content-parts"
        ),
        pytest.param("hi", "messages: must be a list", id="not-a-list"),
        pytest.param([], "messages: must not be empty", id="empty-list"),
        pytest.param(
            [U, U, {"role": "robot", "content": "x"}],
            "messages[2].role: 'robot' is not one of system, user, assistant",
            id="unknown-role",
        ),
        pytest.param(
            [{"role": "user", "content": "   "}], "messages[0].content: must not be empty", id="blank-content"
        ),
        pytest.param(
            [{"role": "user", "content": 3}], "messages[0].content: must be a string", id="number-content"
        ),
        pytest.param(
            [{"role": "user", "content": "x" * 40_000}],
            "messages[0].content: 40000 characters is more than the limit",
            id="oversized",
        ),
        pytest.param(["hi"], "messages[0]: must be an object", id="string-message"),
        pytest.param(
            [U, {"role": "assistant", "content": "a"}],
            "messages[1].role: the last message",
            id="ends-with-assistant",
        ),
    ],
)
def test_validate_messages(messages, error):
    if error is None:
        out = validate_messages(messages)
        assert all(set(m) == {"role", "content"} for m in out)
    else:
        with pytest.raises(RequestError, match=__import__("re").escape(error)):
            validate_messages(messages)


def test_oversized_message_is_413():
    with pytest.raises(RequestError) as err:
        validate_messages([{"role": "user", "content": "x" * 40_000}])
    assert err.value.status == 413


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, SamplingParams(max_new_tokens=64), id="defaults"),
        pytest.param(
            {"max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "stop": "\n"},
            SamplingParams(5, 0.7, 0.9, ("\n",)),
            id="all",
        ),
        pytest.param(
            {"max_completion_tokens": 7, "stop": ["a", "b"], "seed": 3},
            SamplingParams(7, 0.0, 1.0, ("a", "b"), 3),
            id="openai-new-names",
        ),
        pytest.param(
            {"max_tokens": 1000}, "max_tokens: 1000 is more than the limit 128", id="too-many-tokens"
        ),
        pytest.param({"max_tokens": 0}, "max_tokens: 0 is outside 1..128", id="zero-tokens"),
        pytest.param({"max_tokens": "5"}, "max_tokens: must be an integer", id="string-tokens"),
        pytest.param({"temperature": 3}, "temperature: 3 is outside 0.0..2.0", id="hot"),
        pytest.param({"top_p": 0}, "top_p: must be greater than 0", id="top-p-zero"),
        pytest.param({"stop": 5}, "stop: must be a string or a list", id="stop-number"),
        pytest.param({"stop": ["a"] * 5}, "stop: 5 sequences is more than the limit 4", id="stop-many"),
        pytest.param({"stop": [""]}, "stop[0]: must be 1-64 characters", id="stop-empty"),
        pytest.param({"seed": True}, "seed: must be an integer", id="seed-bool"),
    ],
)
def test_parse_sampling(params, expected):
    if isinstance(expected, str):
        with pytest.raises(RequestError, match=__import__("re").escape(expected)):
            parse_sampling(params, max_new_tokens_limit=128)
    else:
        assert parse_sampling(params, max_new_tokens_limit=128) == expected


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        pytest.param("conv-1", True, id="simple"),
        pytest.param("user:42.a_b", True, id="all-classes"),
        pytest.param("x" * 128, True, id="max-length"),
        pytest.param("x" * 129, False, id="too-long"),
        pytest.param("", False, id="empty"),
        pytest.param("a b", False, id="space"),
        pytest.param("../etc", False, id="slash"),
        pytest.param(7, False, id="number"),
    ],
)
def test_validate_session_id(value, ok):
    if ok:
        assert validate_session_id(value) == value
    else:
        with pytest.raises(RequestError, match="session_id: must be 1-128 characters"):
            validate_session_id(value)


def test_render_prompt_marks_system_prefix(tokenizer):
    msgs = [{"role": "system", "content": "You are terse."}, U]
    prompt = render_prompt(tokenizer, msgs, max_context_tokens=512, max_new_tokens=16)
    sys_only = tokenizer.apply_chat_template(msgs[:1], tokenize=False)
    assert prompt.system_len == len(tokenizer(sys_only, add_special_tokens=False)["input_ids"])
    assert prompt.dropped_messages == 0


def test_render_prompt_drops_oldest_turns_keeps_system(tokenizer):
    history = []
    for i in range(20):
        history += [
            {"role": "user", "content": f"question {i} " * 5},
            {"role": "assistant", "content": "answer " * 5},
        ]
    msgs = [{"role": "system", "content": "S"}, *history, {"role": "user", "content": "last"}]
    prompt = render_prompt(tokenizer, msgs, max_context_tokens=200, max_new_tokens=50)
    assert len(prompt.ids) <= 150
    assert prompt.dropped_messages > 0
    assert prompt.messages[0]["role"] == "system" and prompt.messages[-1]["content"] == "last"


def test_render_prompt_too_long_single_message(tokenizer):
    with pytest.raises(RequestError, match="messages: the prompt is"):
        render_prompt(
            tokenizer, [{"role": "user", "content": "word " * 500}], max_context_tokens=100, max_new_tokens=10
        )
