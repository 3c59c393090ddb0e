"""Validate chat messages and request parameters, and render prompts with the tokenizer's chat template.

Plain Python (the tokenizer is passed in): the chat API uses the validators, the Triton model uses the
renderer. Every error names the field, e.g. ``messages[2].role: 'robot' is not one of system, user,
assistant``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 32_000
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 64
#: OpenAI's seed is a 64-bit signed integer (vLLM bounds it the same way); torch accepts this range.
SEED_RANGE = (-(2**63), 2**63 - 1)
#: OpenAI's presence_penalty and frequency_penalty range.
PENALTY_RANGE = (-2.0, 2.0)
#: OpenAI's logit_bias: token id -> bias in -100..100.
LOGIT_BIAS_RANGE = (-100.0, 100.0)
MAX_LOGIT_BIAS = 300
MAX_USER_CHARS = 512

#: OpenAI chat-completion fields this server refuses (400 naming the field) unless given a value that
#: asks for nothing: field -> (values that are accepted as "off", what the message says).
REFUSED_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "tools": ((None, []), "tool calling is not supported by this server"),
    "tool_choice": ((None, "none"), "tool calling is not supported by this server"),
    "functions": ((None, []), "tool calling is not supported by this server"),
    "function_call": ((None, "none"), "tool calling is not supported by this server"),
    "response_format": ((None, {"type": "text"}), 'only {"type": "text"} is supported (no JSON mode)'),
    "logprobs": ((None, False), "not supported"),
    "top_logprobs": ((None, 0), "not supported"),
    "modalities": ((None, ["text"]), 'only ["text"] is supported'),
    "audio": ((None,), "not supported"),
    "prediction": ((None,), "not supported"),
}
#: Fields that are read and honoured (see parse_sampling and the chat API).
HONOURED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "n",
        "user",
        "session_id",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "continue_final_message",
        "add_generation_prompt",
    }
)
#: OpenAI bookkeeping fields accepted without effect (documented no-ops, not reported as ignored).
NO_OP_FIELDS = frozenset({"metadata", "store", "service_tier", "parallel_tool_calls", "reasoning_effort"})


class RequestError(ValueError):
    """A client error: the message names the field and says what is wrong (maps to HTTP 4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (0 temperature means greedy)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token already generated (OpenAI semantics)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was already generated (OpenAI semantics)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to those tokens' logits at every step (OpenAI's logit_bias)."""
    top_k: int = 0
    """Sample among the k most likely tokens only; 0 = all (the Triton models' PARAMETERS, not OpenAI's)."""


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: token ids, how many leading tokens are the system prefix, turns dropped."""

    ids: list[int]
    system_len: int = 0
    dropped_messages: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)


def validate_session_id(value: Any, field_name: str = "session_id") -> str:
    """Return the session id if it is 1-128 chars of [A-Za-z0-9_.:-], else raise RequestError."""
    if not isinstance(value, str) or not SESSION_ID_RE.match(value):
        raise RequestError(
            f"{field_name}: must be 1-128 characters of A-Z a-z 0-9 _ . : - (got {value!r:.40})"
        )
    return value


def session_key_from_user(value: Any) -> str:
    """OpenAI's `user` as a session key: kept when it is a valid session id, else hashed.

    >>> session_key_from_user("conv-1")
    'conv-1'
    >>> session_key_from_user("alice@example.com")
    'user-ff8d9819fc0e12bf0d24892e45987e24'
    """
    if not isinstance(value, str) or not value:
        raise RequestError(f"user: must be a string of 1-{MAX_USER_CHARS} characters (got {value!r:.40})")
    if len(value) > MAX_USER_CHARS:
        raise RequestError(f"user: {len(value)} characters is more than the limit {MAX_USER_CHARS}")
    if SESSION_ID_RE.match(value):
        return value
    return "user-" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]


def check_openai_fields(body: dict[str, Any]) -> list[str]:
    """Refuse OpenAI fields this server cannot honour (RequestError naming the field); return the
    names of unknown fields, which are ignored (the chat API lists them in its answer)."""
    for name, (off, why) in REFUSED_FIELDS.items():
        if name in body and body[name] not in off:
            raise RequestError(f"{name}: {why}")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError("stream_options: must be an object")
        for key in ("include_usage", "continuous_usage_stats"):
            value = options.get(key)
            if value is not None and not isinstance(value, bool):
                raise RequestError(f"stream_options.{key}: must be true or false")
    known = HONOURED_FIELDS | NO_OP_FIELDS | REFUSED_FIELDS.keys()
    return sorted(k for k in body if k not in known)


def continuous_usage(body: dict[str, Any]) -> bool:
    """vLLM's ``stream_options.continuous_usage_stats``: every content chunk of a stream carries ``usage``
    (the tokens so far), not only the last (checked by ``check_openai_fields``).

    >>> continuous_usage({"stream_options": {"continuous_usage_stats": True}})
    True
    """
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("continuous_usage_stats") is True


def parse_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias {"token id": bias} as sorted (id, bias) pairs; ids are checked at the model."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise RequestError("logit_bias: must be an object mapping token ids to numbers")
    if len(value) > MAX_LOGIT_BIAS:
        raise RequestError(f"logit_bias: {len(value)} entries is more than the limit {MAX_LOGIT_BIAS}")
    out = []
    for key, bias in value.items():
        if not isinstance(key, str) or not key.isdigit() or len(key) > 9:
            raise RequestError(f"logit_bias: keys must be token ids (got {key!r:.20})")
        lo, hi = LOGIT_BIAS_RANGE
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not lo <= bias <= hi:
            raise RequestError(f"logit_bias[{key}]: {bias!r:.20} is outside {lo:g}..{hi:g}")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def validate_messages(
    messages: Any,
    *,
    max_content_chars: int = MAX_CONTENT_CHARS,
    allow_empty_list: bool = False,
    continuing: bool = False,
) -> list[dict[str, str]]:
    """Check an OpenAI-shaped messages list and return it as plain {role, content} dicts (the last one an
    assistant's only when ``continuing``: ``continue_final_message``)."""
    if not isinstance(messages, list):
        raise RequestError("messages: must be a list of {role, content} objects")
    if not messages and not allow_empty_list:
        raise RequestError("messages: must not be empty")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(f"messages: {len(messages)} messages is more than the limit {MAX_MESSAGES}")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{where}: must be an object with role and content")
        role = msg.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
        content = msg.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
                raise RequestError(f"{where}.content: only text content parts are supported")
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"{where}.content: must be a string")
        if not content.strip():
            raise RequestError(f"{where}.content: must not be empty")
        if len(content) > max_content_chars:
            raise RequestError(
                f"{where}.content: {len(content)} characters is more than the limit {max_content_chars}",
                status=413,
            )
        out.append({"role": role, "content": content})
    if out and out[-1]["role"] == "assistant" and not (allow_empty_list or continuing):
        raise RequestError(
            f"messages[{len(out) - 1}].role: the last message must be from user or system (an assistant's "
            "only with continue_final_message: true)"
        )
    return out


def _number(params: dict, key: str, kind: type, lo: float, hi: float, default):
    value = params.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise RequestError(
            f"{key}: must be {'an integer' if kind is int else 'a number'} (got {value!r:.40})"
        )
    if not lo <= value <= hi or (isinstance(value, float) and not math.isfinite(value)):
        raise RequestError(f"{key}: {value} is outside {lo}..{hi}")
    return kind(value)


def parse_sampling(
    params: dict[str, Any], *, max_new_tokens_limit: int, default_max_tokens: int = 64
) -> SamplingParams:
    """Validate OpenAI-style sampling fields (max_tokens, temperature, top_p, stop, seed, penalties).

    Every number is bounded (a value outside its range is a RequestError naming the field), so no
    request can carry a setting that fails in the batch: e.g. seed 2**64 -> "seed: ... is outside".
    """
    if not isinstance(params, dict):
        raise RequestError("parameters: must be an object")
    max_tokens = params.get("max_tokens", params.get("max_completion_tokens"))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > max_new_tokens_limit:
        raise RequestError(f"max_tokens: {max_tokens} is more than the limit {max_new_tokens_limit}")
    max_tokens = _number(
        {"max_tokens": max_tokens},
        "max_tokens",
        int,
        1,
        max_new_tokens_limit,
        min(default_max_tokens, max_new_tokens_limit),
    )
    temperature = _number(params, "temperature", float, 0.0, 2.0, 0.0)
    top_p = _number(params, "top_p", float, 0.0, 1.0, 1.0)
    if top_p <= 0.0:
        raise RequestError("top_p: must be greater than 0")
    stop = params.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise RequestError("stop: must be a string or a list of strings")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise RequestError(f"stop: {len(stops)} sequences is more than the limit {MAX_STOP_SEQUENCES}")
    for i, s in enumerate(stops):
        if not s or len(s) > MAX_STOP_CHARS:
            raise RequestError(f"stop[{i}]: must be 1-{MAX_STOP_CHARS} characters")
    seed = _number(params, "seed", int, *SEED_RANGE, None)
    presence = _number(params, "presence_penalty", float, *PENALTY_RANGE, 0.0)
    frequency = _number(params, "frequency_penalty", float, *PENALTY_RANGE, 0.0)
    bias = parse_logit_bias(params.get("logit_bias"))
    return SamplingParams(max_tokens, temperature, top_p, stops, seed, presence, frequency, bias)


def continuation_flag(body: dict[str, Any]) -> bool:
    """``continue_final_message`` as a bool, with ``add_generation_prompt`` checked against it (either
    wrong: an error naming the field). Read before the messages, whose last may then be the assistant's.

    >>> continuation_flag({"continue_final_message": True, "add_generation_prompt": False})
    True
    """
    cont = body.get("continue_final_message", False)
    if not isinstance(cont, bool):
        raise RequestError("continue_final_message: must be true or false")
    gen = body.get("add_generation_prompt")
    if gen is not None and not isinstance(gen, bool):
        raise RequestError("add_generation_prompt: must be true or false")
    if cont and gen:
        raise RequestError(
            "add_generation_prompt: must be false with continue_final_message: true (the answer continues "
            "the final message)"
        )
    if gen is False and not cont:
        raise RequestError("add_generation_prompt: false is supported only with continue_final_message: true")
    return cont


def parse_continuation(body: dict[str, Any], messages: Sequence[dict[str, str]]) -> bool:
    """Whether the request continues its final (assistant) message instead of answering it.

    vLLM's fields: ``continue_final_message: true`` (with ``add_generation_prompt`` absent or false) renders
    the conversation up to the final message's last character, and the answer is the rest of that
    message. A stream relay sends it to resume an answer another replica began (docs/runtime.md "Streams
    that survive their replica").

    >>> parse_continuation({"continue_final_message": True}, [{"role": "assistant", "content": "Par"}])
    True
    >>> parse_continuation({}, [{"role": "user", "content": "hi"}])
    False
    """
    cont = continuation_flag(body)
    if cont and messages[-1]["role"] != "assistant":
        raise RequestError(
            f"messages[{len(messages) - 1}].role: continue_final_message needs the final message to be the "
            f"assistant's (got {messages[-1]['role']!r})"
        )
    return cont


def _encode(
    tokenizer, messages: Sequence[dict[str, str]], add_generation_prompt: bool, continue_final: bool = False
) -> list[int]:
    text = tokenizer.apply_chat_template(
        list(messages),
        tokenize=False,
        add_generation_prompt=add_generation_prompt and not continue_final,
        continue_final_message=continue_final,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_prompt(
    tokenizer,
    messages: Sequence[dict[str, str]],
    *,
    max_context_tokens: int,
    max_new_tokens: int,
    continue_final: bool = False,
) -> Prompt:
    """Apply the chat template; drop the oldest non-system messages until prompt + answer fit the context.

    Example: context 2048, max_new_tokens 256 -> the prompt may hold at most 1792 tokens. With
    ``continue_final`` the prompt ends inside the final (assistant) message, which is never dropped, nor
    the message before it.
    """
    budget = max_context_tokens - max_new_tokens
    if budget < 1:
        raise RequestError(
            f"max_tokens: {max_new_tokens} leaves no room in the context of {max_context_tokens}"
        )
    system = [m for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    dropped = 0
    while True:
        msgs = system + rest
        ids = _encode(tokenizer, msgs, add_generation_prompt=True, continue_final=continue_final)
        if len(ids) <= budget:
            break
        if len(rest) <= (2 if continue_final else 1):
            raise RequestError(
                f"messages: the prompt is {len(ids)} tokens, more than the {budget} left in the context "
                f"({max_context_tokens}) after max_tokens ({max_new_tokens})"
            )
        rest = rest[1:]
        dropped += 1
    system_len = 0
    if system:
        sys_ids = _encode(tokenizer, system, add_generation_prompt=False)
        if ids[: len(sys_ids)] == sys_ids:
            system_len = len(sys_ids)
    return Prompt(ids=ids, system_len=system_len, dropped_messages=dropped, messages=msgs)
