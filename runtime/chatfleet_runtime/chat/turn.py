"""A chat request as the pipeline's ``Turn``: step 1's checks of the body, and the turn steps 2 to 5 carry.

``read_body`` and ``parse_request`` check the body (a ``RequestError`` naming the field); ``bypasses_cache``
says whether a request keeps away from the answer cache. ``ChatPipeline`` makes a ``Turn`` of a request
that passed, with its history (step 2), and steps 3 to 5 carry it. Pure: none of the pipeline's state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet_runtime.chat.tracing import NO_TRACE, RequestTrace
from chatfleet_runtime.prompting import (
    RequestError,
    SamplingParams,
    check_openai_fields,
    continuation_flag,
    parse_sampling,
    session_key_from_user,
    validate_messages,
    validate_session_id,
)


@dataclass
class Turn:
    """One validated request on its way through the pipeline."""

    messages: list[dict[str, str]]
    """The request's messages, as sent (the fallback answers from these before Triton is asked)."""
    prompt_messages: list[dict[str, str]]
    """What the model sees: the stored history, then the request's messages."""
    params: dict[str, Any]
    """The PARAMETERS input of the Triton model (sampling and session id)."""
    stream: bool
    session_id: str | None
    info: dict[str, Any]
    """The `chatfleet` fields of the answer: history state, ignored fields."""
    t0: float
    """When the request arrived (time.monotonic)."""
    previous_revision: str | None = None
    """The revision that answered the conversation's last stored turn, when known."""
    store: bool = True
    """Whether the answered turn is saved to the history (False for a mirrored request: read, never written)."""
    cache_key: str | None = None
    """The answer cache's key of this turn; None when the cache is off or the turn is not cacheable."""
    trace: RequestTrace = NO_TRACE
    """The request's span (chat/tracing.py); ``NO_TRACE`` when tracing is off, the request not sampled, or
    the request mirrored."""
    continuous_usage: bool = False
    """Every content chunk carries ``usage`` (``stream_options.continuous_usage_stats``; the stream relay
    asks for it to know how many tokens a cut stream had sent)."""
    continuing: bool = False
    """The request continues its final message (``continue_final_message``): the beginning of an answer
    another replica was streaming when it failed, sent again by the stream relay."""
    heartbeat_s: float = 0.0
    """While a streamed answer waits for its next chunk, an SSE comment (``: heartbeat``) every that many
    seconds (header ``X-Chatfleet-Heartbeat-Seconds``, sent by the stream relay); 0: none."""

    @property
    def stored_turn(self) -> list[dict[str, str]]:
        """The messages saved with the answer: the new ones, less the answer's beginning when continuing
        (that beginning is saved as part of the answer, ``stored_answer``)."""
        return self.new_messages[:-1] if self.continuing else self.new_messages

    def stored_answer(self, text: str) -> str:
        """The whole answer to save: the beginning another replica sent, then this one's text."""
        return self.messages[-1]["content"] + text if self.continuing else text

    @property
    def new_messages(self) -> list[dict[str, str]]:
        """The request's messages without system prompts: what the stored turn and a late fallback use."""
        return [m for m in self.messages if m["role"] != "system"]


def read_body(raw: bytes, max_body_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object, within the size limit."""
    if len(raw) > max_body_bytes:
        raise RequestError(f"body: {len(raw)} bytes is more than the limit {max_body_bytes}", 413)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"body: not valid JSON ({getattr(exc, 'msg', exc)})") from exc
    if not isinstance(body, dict):
        raise RequestError("body: must be a JSON object")
    return body


def parse_request(
    body: dict[str, Any], headers: Mapping[str, str], model_name: str, max_new_tokens: int
) -> tuple[list[dict[str, str]], SamplingParams, str | None, list[str]]:
    """(messages, sampling, session id, ignored fields) of a request body, or RequestError."""
    model = body.get("model", model_name)
    if model != model_name:
        raise RequestError(f"model: {model!r:.80} is not served here (available: {model_name})", 404)
    messages = validate_messages(body.get("messages"), continuing=continuation_flag(body))
    ignored = check_openai_fields(body)
    sampling = parse_sampling(body, max_new_tokens_limit=max_new_tokens)
    if body.get("n", 1) not in (1, None):
        raise RequestError("n: only 1 is supported")
    sid = None
    if headers.get("x-session-id") is not None:
        sid = validate_session_id(headers["x-session-id"], "X-Session-Id")
    elif body.get("session_id") is not None:
        sid = validate_session_id(body["session_id"], "session_id")
    elif body.get("user") is not None:
        sid = session_key_from_user(body["user"])
    return messages, sampling, sid, ignored


#: The stream relay's request header: while a streamed answer waits for its next chunk, the chat API sends an
#: SSE comment every that many seconds, so that the relay can tell a slow answer from a replica gone silent.
HEARTBEAT_HEADER = "x-chatfleet-heartbeat-seconds"
#: The stream relay's request header: the answer then names this replica's address in REPLICA_HEADER (the
#: relay sends the dialogue's next turns straight there, and passes neither header on to the client).
RELAY_HEADER = "x-chatfleet-relay"
REPLICA_HEADER = "x-chatfleet-replica"
HEARTBEAT_BOUNDS = (0.1, 30.0)


def heartbeat_seconds(headers: Mapping[str, str]) -> float:
    """The heartbeat interval a streamed request asks for (0.0 when it asks for none), or RequestError.

    >>> heartbeat_seconds({"x-chatfleet-heartbeat-seconds": "0.5"}), heartbeat_seconds({})
    (0.5, 0.0)
    """
    raw = headers.get(HEARTBEAT_HEADER)
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    low, high = HEARTBEAT_BOUNDS
    if not low <= value <= high:
        raise RequestError(
            f"X-Chatfleet-Heartbeat-Seconds: must be seconds from {low:g} to {high:g}, not {raw!r:.40}"
        )
    return value


#: Request headers that keep a request away from the answer cache: the release analysis asks the model,
#: never the cache (its quality and traffic probes), and so does a client that says no-cache or no-store.
_ANALYSIS_HEADERS = ("x-chatfleet-quality", "x-chatfleet-probe")


def bypasses_cache(headers: Mapping[str, str]) -> bool:
    """Whether a request must neither be answered from the answer cache nor fill it."""
    lower = {k.lower(): v for k, v in headers.items()}
    if any(lower.get(h) for h in _ANALYSIS_HEADERS):
        return True
    directives = lower.get("cache-control", "").lower()
    return "no-cache" in directives or "no-store" in directives
