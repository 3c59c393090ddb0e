"""One client stream out of several replica streams: what was sent, the request that resumes it, and the
chunks of the resumed answer rewritten to read as the first's. Pure: no I/O, no clock.

A replica's stream is OpenAI's server-sent events: ``data: {chunk}`` lines, then ``data: [DONE]``. The
relay passes each chunk on and keeps, in ``Progress``, the answer's text so far and the first stream's
``id`` and ``created``. When the replica's stream ends before ``[DONE]`` (its connection cut, a silence
past the stall limit, or the chat API's ``stream_cut`` error event when its Triton failed part-way),
``resume_body`` is the same request with that text as the final assistant message and
``continue_final_message: true``, and ``Progress.rewrite`` makes the new replica's chunks continue the first
stream: the first stream's id and created, no second ``role``, and the usage counting every token the
client got. The relay asks each replica for vLLM's ``stream_options.continuous_usage_stats`` (``asked``), so
every content chunk says how many tokens the answer has so far; the client gets those per-chunk usages only
when it asked for them itself.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


class Cut(Exception):
    """A replica's stream ended before [DONE]; the message says how, ``reason`` in a word (``closed``,
    ``stalled``, ``error_event``)."""

    def __init__(self, message: str, reason: str = "error_event") -> None:
        super().__init__(message)
        self.reason = reason


def event_data(line: str) -> str | None:
    """The data of one server-sent event line ('data: x' -> 'x'); None for other lines (blank, comments).

    >>> event_data('data: {"a": 1}')
    '{"a": 1}'
    >>> event_data(": keep-alive") is None
    True
    """
    if not line.startswith("data:"):
        return None
    return line[5:].lstrip(" ")


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event of a chunk (or the [DONE] marker)."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"


def cut_error(message: str) -> dict[str, Any]:
    """OpenAI's error object inside a stream (its SDK raises it): what the client gets when no replica could
    finish the answer (code ``stream_cut``, as the chat API's own)."""
    return {"error": {"message": message, "type": "server_error", "param": None, "code": "stream_cut"}}


@dataclass
class Progress:
    """What the client has been sent of one answer, across the replicas that streamed it."""

    id: str | None = None
    created: int | None = None
    text: list[str] = field(default_factory=list)
    """The answer's content chunks, in order."""
    tokens: int = 0
    """The answer's tokens sent so far (the replicas' per-chunk usage; a chunk without one counts 1)."""
    resumes: int = 0
    """Replica streams after the first (each began where the one before was cut)."""
    continuous_usage: bool = False
    """The client asked for usage in every chunk (else only the last chunk's is passed on)."""
    role_sent: bool = False
    finished: bool = False
    """A chunk with a finish_reason was sent: the answer is whole, only [DONE] (and usage) may be missing."""
    tokens_before_resume: int = 0
    """Tokens the client got from the replicas before the current one (added to its usage)."""

    @property
    def answer(self) -> str:
        """The answer's text so far."""
        return "".join(self.text)

    def begin_resume(self) -> None:
        """A new replica stream begins: the chunks so far belong to those before it."""
        self.resumes += 1
        self.tokens_before_resume = self.tokens

    def rewrite(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk as the client gets it, recording its content; None to drop it (a resumed stream's
        opening role chunk, which would repeat the first's).

        The error event of a replica whose model failed part-way raises ``Cut`` (never passed on).
        """
        if "error" in chunk:
            raise Cut(str(chunk["error"].get("message", chunk["error"])))
        if self.id is None:
            self.id, self.created = chunk.get("id"), chunk.get("created")
        elif self.resumes:
            chunk = {**chunk, "id": self.id, "created": self.created}
        choices = chunk.get("choices") or []
        if choices:
            choice = choices[0]
            delta = dict(choice.get("delta") or {})
            if "role" in delta:
                if self.role_sent:
                    del delta["role"]
                self.role_sent = True
            if choice.get("finish_reason") is not None:
                self.finished = True
            content = delta.get("content")
            if content:
                self.text.append(content)
                so_far = (chunk.get("usage") or {}).get("completion_tokens")
                self.tokens = self.tokens_before_resume + so_far if so_far else self.tokens + 1
            elif "content" in delta and self.resumes:
                del delta["content"]
            chunk = {**chunk, "choices": [{**choice, "delta": delta}, *choices[1:]]}
            if choice.get("finish_reason") is None and not self.continuous_usage:
                chunk.pop("usage", None)
            if not delta and choice.get("finish_reason") is None and "usage" not in chunk:
                return None
        usage = chunk.get("usage")
        if usage and self.tokens_before_resume:
            before = self.tokens_before_resume
            chunk["usage"] = {
                **usage,
                "completion_tokens": usage.get("completion_tokens", 0) + before,
                "total_tokens": usage.get("total_tokens", 0) + before,
            }
        return chunk


def asked(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the relay sends it to a replica: with usage in every chunk
    (``stream_options.continuous_usage_stats``), so a cut stream's tokens are known.

    >>> asked({"stream": True})["stream_options"]
    {'continuous_usage_stats': True}
    """
    options = body.get("stream_options", {})
    if not isinstance(options, dict):  # the replica's 400 names the field
        return body
    return {**body, "stream_options": {**options, "continuous_usage_stats": True}}


def resume_body(body: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The request that continues the answer on another replica: the same messages, then the answer so far
    as the final assistant message with ``continue_final_message``; ``max_tokens`` (or
    ``max_completion_tokens``) less the tokens already sent, at least 1.

    >>> p = Progress(text=["Hel", "lo"], tokens=2)
    >>> b = resume_body({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}, p)
    >>> b["messages"][-1], b["continue_final_message"], b["max_tokens"]
    ({'role': 'assistant', 'content': 'Hello'}, True, 3)
    """
    out = copy.deepcopy(body)
    out["messages"] = [*out.get("messages", []), {"role": "assistant", "content": progress.answer}]
    out["continue_final_message"] = True
    out.pop("add_generation_prompt", None)
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(key), int) and not isinstance(out[key], bool):
            out[key] = max(1, out[key] - progress.tokens)
    return out
