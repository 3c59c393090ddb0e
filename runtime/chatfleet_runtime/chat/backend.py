"""The chat API's backend: Triton's one chat model (decoupled) over gRPC, one completion or a stream of chunks.

Both kinds go over a gRPC stream to the same model, so they share its in-flight batch: a non-streaming
request sends ``"stream": false`` and gets no deltas, only the final response with the whole text.

Errors come back as ``BackendError`` with a kind the pipeline acts on: ``invalid`` (the client's fault,
HTTP 400), ``overloaded`` (the model's KV budget is full: HTTP 429 with Retry-After), ``unavailable``,
``timeout`` or ``error`` (the breaker counts them, the fallback answers).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from chatfleet_contract.parameters import ModelParameters, read_model_config
from chatfleet_contract.tritonconfig import INVALID_REQUEST as INVALID
from chatfleet_contract.tritonconfig import MODEL_NAME, OVERLOADED

from chatfleet_runtime.prompting import SamplingParams


class BackendError(Exception):
    """A failed Triton call; kind is invalid (client's fault), overloaded, unavailable, timeout or error."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class Chunk:
    """A piece of a response: text and, on the last one, the finish reason and token counts."""

    text: str
    finish_reason: str = ""
    num_tokens: int = 0
    prompt_tokens: int = 0


def _classify(exc: Exception) -> BackendError:
    """A tritonclient error as a BackendError (the model's `invalid_request: ` prefix means the client's fault,
    `overloaded: ` a full KV budget)."""
    msg = str(exc)
    if INVALID in msg:
        return BackendError("invalid", msg[msg.index(INVALID) + len(INVALID) :].strip())
    if OVERLOADED in msg:
        return BackendError("overloaded", msg[msg.index(OVERLOADED) + len(OVERLOADED) :].strip())
    status = str(getattr(exc, "status", lambda: "")() or "")
    if "UNAVAILABLE" in status or "UNAVAILABLE" in msg or "failed to connect" in msg.lower():
        return BackendError("unavailable", msg)
    if "DEADLINE_EXCEEDED" in status or "Deadline" in msg:
        return BackendError("timeout", msg)
    return BackendError("error", msg)


class TritonChat:
    """Calls the chat model through tritonclient's asyncio gRPC client (one channel per API process)."""

    def __init__(self, url: str):
        import tritonclient.grpc.aio as grpcclient

        self._mod = grpcclient
        self.url = url
        self._client = None

    @property
    def client(self):
        """The gRPC client, created on first use inside the serving event loop (aio channels bind to it)."""
        if self._client is None:
            self._client = self._mod.InferenceServerClient(self.url)
        return self._client

    def _inputs(self, messages: list[dict[str, str]], params: dict[str, Any]):
        import numpy as np

        a = self._mod.InferInput("MESSAGES", [1, 1], "BYTES")
        a.set_data_from_numpy(np.array([[json.dumps(messages).encode()]], dtype=np.object_))
        b = self._mod.InferInput("PARAMETERS", [1, 1], "BYTES")
        b.set_data_from_numpy(np.array([[json.dumps(params).encode()]], dtype=np.object_))
        return [a, b]

    async def ready(self) -> bool:
        """Whether the chat model is loaded and warmed up."""
        try:
            return bool(await self.client.is_model_ready(MODEL_NAME))
        except Exception:
            return False

    async def max_new_tokens(self) -> int | None:
        """The chat model's max_new_tokens parameter (None when it cannot be read)."""
        try:
            cfg = await self.client.get_model_config(MODEL_NAME, as_json=True)
            params, _, _ = read_model_config(cfg["config"])
            return ModelParameters.from_parameters(params).max_new_tokens
        except Exception:
            return None

    async def complete(self, messages, params, timeout: float) -> Chunk:
        """One non-streaming completion: ``stream: false`` on the same model, so it joins the running batch
        with the streamed ones and comes back as one final response with the whole text."""
        chunks = [c async for c in self.stream(messages, {**params, "stream": False}, timeout)]
        return chunks[-1]  # the only one: stream() raises unless a final chunk came

    async def stream(self, messages, params, timeout: float) -> AsyncIterator[Chunk]:
        """Streamed completion: deltas, the last one with a finish reason; cancels Triton on exit."""

        async def one():
            yield {"model_name": MODEL_NAME, "inputs": self._inputs(messages, params)}

        call = self.client.stream_infer(one(), stream_timeout=timeout)
        try:
            async for result, error in call:
                if error is not None:
                    raise _classify(error)
                chunk = _chunk(result)
                yield chunk
                if chunk.finish_reason:
                    return
            raise BackendError("error", "stream ended without a final response")
        except BackendError:
            raise
        except (StopAsyncIteration, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            raise _classify(exc) from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        """Close the channel."""
        if self._client is not None:
            await self._client.close()


def _chunk(result) -> Chunk:
    """A Chunk from a Triton result (PROMPT_TOKENS may be missing on an older model config)."""
    prompt = result.as_numpy("PROMPT_TOKENS")
    return Chunk(
        result.as_numpy("TEXT").reshape(-1)[0].decode("utf-8", "replace"),
        result.as_numpy("FINISH_REASON").reshape(-1)[0].decode(),
        int(result.as_numpy("NUM_TOKENS").reshape(-1)[0]),
        int(prompt.reshape(-1)[0]) if prompt is not None else 0,
    )


def triton_params(sampling: SamplingParams, sid: str | None, continuing: bool = False) -> dict[str, Any]:
    """The PARAMETERS input of the Triton chat model (docs/pod-contract.md, Requests);
    ``continue_final_message`` only when the request continues its final message."""
    params: dict[str, Any] = {
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stop": list(sampling.stop),
        "seed": sampling.seed,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "logit_bias": {str(t): b for t, b in sampling.logit_bias},
        "session_id": sid,
    }
    if continuing:
        params["continue_final_message"] = True
    return params
