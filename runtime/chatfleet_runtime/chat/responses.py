"""OpenAI-shaped replies of the chat API: completion bodies, stream chunks, errors, without HTTP.

A ``Reply`` is what the pipeline hands the route: a JSON body or a stream of server-sent events, with a
status and headers. The route only turns it into a FastAPI response.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

#: The last server-sent event of every stream.
DONE = "data: [DONE]\n\n"
#: An SSE comment: a stream that asked for heartbeats gets one whenever its next chunk is slow to come
#: (clients skip comments; the stream relay asks for them to tell a slow answer from a silent replica).
HEARTBEAT = ": heartbeat\n\n"


@dataclass
class Reply:
    """A JSON body (`body`) or server-sent events (`events`), with the HTTP status and extra headers."""

    body: dict[str, Any] | None = None
    events: AsyncIterator[str] | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


def error(status: int, message: str) -> Reply:
    """OpenAI's error object; `param` is the field the message starts with ('model: ...' -> 'model')."""
    param = message.split(":", 1)[0] if ":" in message else None
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = "model_not_found" if status == 404 else None
    return Reply({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def draining() -> Reply:
    """The 503 of a draining replica: OpenAI's error with code ``replica_draining`` and ``Retry-After: 1``
    (``Connection: close`` comes from the drain's gate, as on every answer once the drain settled;
    docs/runtime.md "Draining")."""
    reply = error(
        503, "this replica is draining (shutting down) and takes no new requests; retry the request"
    )
    reply.body["error"]["code"] = "replica_draining"
    reply.headers["Retry-After"] = "1"
    return reply


def stream_error(message: str) -> str:
    """An error inside a stream that began (a server-sent event of OpenAI's error object, code
    ``stream_cut``): the last event of a stream whose answer was cut; no [DONE] follows."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": "stream_cut"}}
    return f"data: {json.dumps(body)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def envelope(model: str, obj: str, sid: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    """The fields every completion and chunk carries, with `chatfleet` (session, fallback, history ...)."""
    extra = {k: v for k, v in extra.items() if k != "ignored_fields" or v}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "chatfleet": {"session_id": sid, "fallback": False, **extra},
    }


def completion(head: dict[str, Any], text: str, finish_reason: str, used: dict[str, int]) -> dict[str, Any]:
    """A whole chat.completion body: the envelope, one assistant message and the usage."""
    return {
        **head,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
        ],
        "usage": used,
    }


def sse(
    head: dict[str, Any], delta: dict[str, Any], finish_reason: str | None, used: dict[str, int] | None = None
) -> str:
    """One chat.completion.chunk as a server-sent event."""
    chunk = dict(head)
    chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    if used is not None:
        chunk["usage"] = used
    return f"data: {json.dumps(chunk)}\n\n"
