"""Steps 4 and 5 of the chat pipeline: Triton asked within the deadline, the answer sent and saved.

``AnswerSteps`` is ``ChatPipeline``'s base: the pipeline holds the state (the attributes below, set in its
``__init__``) and runs steps 1 to 3; these methods answer an admitted turn, streamed (``_stream``, then
``_events``) or not (``_complete``), and every answer that is not the model's own: the answer cache's kept
one (``_from_cache``), the FAQ or fallback text (``_fallback``), Triton's refusal as a 400 or a 429
(``_failed``). ``_remember`` saves the answered turn to the history, ``_keep`` to the answer cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from chatfleet_runtime.chat import responses
from chatfleet_runtime.chat.answercache import AnswerCache, Cached
from chatfleet_runtime.chat.apisettings import ApiSettings
from chatfleet_runtime.chat.backend import BackendError, Chunk
from chatfleet_runtime.chat.breaker import CircuitBreaker, Fallback
from chatfleet_runtime.chat.metrics import ApiMetrics
from chatfleet_runtime.chat.responses import Reply
from chatfleet_runtime.chat.sessions import SessionStore
from chatfleet_runtime.chat.turn import Turn

#: Retry-After (seconds) of the 429 answered when the model's KV budget refused a request.
OVERLOADED_RETRY_AFTER_S = 1


class AnswerSteps:
    """Steps 4 and 5 of ``ChatPipeline`` (its base), and the replies that are not the model's answer."""

    # set by ChatPipeline.__init__
    settings: ApiSettings
    name: str
    metrics: ApiMetrics
    backend: Any
    breaker: CircuitBreaker
    fallback: Fallback
    cache: AnswerCache | None
    store: SessionStore
    inflight: int

    async def _remember(self, turn: Turn, reply: str) -> None:
        """Store the answered turn with this pod's revision; count a revision switch once it is kept (in
        Redis or this replica's copy: the dialogue's next turn here reads it)."""
        if turn.session_id is None or not turn.store:
            return
        revision = self.settings.revision
        saved = await self.store.append(
            turn.session_id, turn.stored_turn, turn.stored_answer(reply), revision
        )
        if saved and revision and turn.previous_revision and turn.previous_revision != revision:
            self.metrics.revision_switches.labels(self.name).inc()

    def _count(self, outcome: str, code: int, stream: bool) -> None:
        self.metrics.requests.labels(self.name, outcome, str(code), str(stream).lower()).inc()

    def _keep(self, turn: Turn, text: str, finish_reason: str, prompt_tokens: int, num_tokens: int) -> None:
        """Keep a whole answer of a cacheable turn in the answer cache."""
        if self.cache is None or turn.cache_key is None:
            return
        self.cache.put(turn.cache_key, text, finish_reason, prompt_tokens, num_tokens)
        self.metrics.answer_cache_entries.labels(self.name).set(len(self.cache))

    async def _from_cache(self, turn: Turn, kept: Cached) -> Reply:
        """The kept answer of a repeated first-turn question, saved to the session like a generated one;
        marked by ``X-Chatfleet-Cache: hit`` and ``"chatfleet": {"cache": "hit"}``."""
        info = {**turn.info, "cache": "hit"}
        headers = {"X-Chatfleet-Cache": "hit"}
        used = responses.usage(kept.prompt_tokens, kept.num_tokens)
        finish = "length" if kept.finish_reason == "length" else "stop"

        def done() -> None:
            elapsed = time.monotonic() - turn.t0
            stream = str(turn.stream).lower()
            self.metrics.duration.labels(self.name, stream).observe(elapsed)
            self.metrics.ttft.labels(self.name, stream).observe(elapsed)
            self.metrics.gen_ai(self.name, elapsed, ttft=elapsed)
            self._count("success", 200, turn.stream)

        turn.trace.answered(finish, kept.prompt_tokens, kept.num_tokens)
        if not turn.stream:
            await self._remember(turn, kept.text)
            done()
            head = responses.envelope(self.name, "chat.completion", turn.session_id, info)
            return Reply(responses.completion(head, kept.text, finish, used), headers=headers)

        async def events() -> AsyncIterator[str]:
            head = responses.envelope(self.name, "chat.completion.chunk", turn.session_id, info)
            yield responses.sse(head, {"role": "assistant", "content": ""}, None)
            yield responses.sse(head, {"content": kept.text}, None)
            yield responses.sse(head, {}, finish, used)
            await self._remember(turn, kept.text)  # before [DONE], as a generated answer
            yield responses.DONE
            done()

        return Reply(events=events(), headers={**headers, "Cache-Control": "no-cache"})

    def _fallback(self, turn: Turn, messages: list[dict[str, str]], reason: str) -> Reply:
        """The FAQ or fallback text instead of the model's answer, marked as such; a 503 for a request that
        continues an answer (a fallback text glued to it would read as the model's; the relay tries another
        replica)."""
        if turn.continuing:
            turn.trace.failed(reason)
            self._count("error", 503, turn.stream)
            reply = responses.error(
                503, f"continue_final_message: this replica cannot continue the answer now ({reason}); retry"
            )
            reply.headers["Retry-After"] = "1"
            return reply
        text, source = self.fallback.answer(messages)
        turn.trace.fallback(reason)
        self.metrics.fallbacks.labels(self.name, reason, source).inc()
        self._count("fallback", 200, turn.stream)
        elapsed = time.monotonic() - turn.t0
        self.metrics.duration.labels(self.name, str(turn.stream).lower()).observe(elapsed)
        self.metrics.gen_ai(self.name, elapsed, error=f"fallback_{reason}")
        meta = {"fallback": True, "reason": reason, "source": source, **turn.info}
        headers = {"X-Chatfleet-Fallback": source}
        if not turn.stream:
            head = responses.envelope(self.name, "chat.completion", turn.session_id, meta)
            return Reply(responses.completion(head, text, "stop", responses.usage(0, 0)), headers=headers)

        async def events():
            head = responses.envelope(self.name, "chat.completion.chunk", turn.session_id, meta)
            yield responses.sse(head, {"role": "assistant", "content": text}, "stop")
            yield responses.DONE

        return Reply(events=events(), headers=headers)

    def _failed(self, turn: Turn, exc: BackendError) -> Reply:
        """Triton failed before any answer: the client's fault is a 400 and a full KV budget a 429 with
        Retry-After (neither a breaker failure), anything else a breaker failure and a fallback answer."""
        if exc.kind in ("invalid", "overloaded"):
            self.metrics.gen_ai(self.name, time.monotonic() - turn.t0, error=exc.kind)
        if exc.kind == "invalid":
            self.breaker.record_success()
            self._count("client_error", 400, turn.stream)
            return responses.error(400, str(exc))
        if exc.kind == "overloaded":  # the replica is healthy, its KV budget full: retry soon
            self.breaker.record_success()
            self._count("overloaded", 429, turn.stream)
            reply = responses.error(429, str(exc))
            reply.body["error"]["code"] = "overloaded"
            reply.headers["Retry-After"] = str(OVERLOADED_RETRY_AFTER_S)
            return reply
        self.breaker.record_failure()
        return self._fallback(turn, turn.new_messages, exc.kind)

    async def _complete(self, turn: Turn) -> Reply:
        """Steps 4 and 5 without streaming: one completion within the deadline."""
        slot = _Slot(self)
        timeout = self.settings.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                result = await self.backend.complete(turn.prompt_messages, turn.params, timeout)
        except BackendError as exc:
            return self._failed(turn, exc)
        except TimeoutError:
            self.breaker.record_failure()
            return self._fallback(turn, turn.new_messages, "timeout")
        finally:
            slot.release()
        self.breaker.record_success()
        turn.trace.answered(result.finish_reason or "stop", result.prompt_tokens, result.num_tokens)
        elapsed = time.monotonic() - turn.t0
        self.metrics.duration.labels(self.name, "false").observe(elapsed)
        self.metrics.ttft.labels(self.name, "false").observe(elapsed)
        self.metrics.tokens.labels(self.name).inc(result.num_tokens)
        # not streamed: the first token's time is unknown here, so time to first token is the whole
        # response (as chatfleet_time_to_first_token_seconds) and no time per output token is recorded
        self.metrics.gen_ai(self.name, elapsed, ttft=elapsed)
        self._count("success", 200, False)
        await self._remember(turn, result.text)
        self._keep(turn, result.text, result.finish_reason or "stop", result.prompt_tokens, result.num_tokens)
        head = responses.envelope(self.name, "chat.completion", turn.session_id, turn.info)
        used = responses.usage(result.prompt_tokens, result.num_tokens)
        return Reply(responses.completion(head, result.text, result.finish_reason or "stop", used))

    async def _stream(self, turn: Turn) -> Reply:
        """Steps 4 and 5 streamed: wait for the first chunk here (a failure is still a fallback), then
        hand the rest to the reply's event stream."""
        deadline = turn.t0 + self.settings.request_timeout_s
        it = self.backend.stream(
            turn.prompt_messages, turn.params, self.settings.request_timeout_s
        ).__aiter__()
        slot = _Slot(self)
        try:
            async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                first = await it.__anext__()
        except BackendError as exc:
            slot.release()
            await _close(it)
            return self._failed(turn, exc)
        except (TimeoutError, StopAsyncIteration):
            slot.release()
            await _close(it)
            self.breaker.record_failure()
            return self._fallback(turn, turn.new_messages, "timeout")
        ttft = time.monotonic() - turn.t0
        self.metrics.ttft.labels(self.name, "true").observe(ttft)
        turn.trace.first_chunk(ttft)
        events = self._events(turn, it, first, slot, deadline, ttft)
        return Reply(events=events, headers={"Cache-Control": "no-cache"})

    async def _events(
        self, turn: Turn, it: AsyncIterator[Chunk], first: Chunk, slot: _Slot, deadline: float, ttft: float
    ) -> AsyncIterator[str]:
        """The stream's server-sent events; a client that goes away mid-stream is a 499, not a failure."""
        head = responses.envelope(self.name, "chat.completion.chunk", turn.session_id, turn.info)
        parts: list[str] = []
        finish, num_tokens, prompt_tokens, last = "", 0, 0, time.monotonic()
        completed = timed_out = False
        waiting: asyncio.Task | None = None  # the next chunk, while heartbeats go out
        try:
            yield responses.sse(head, {"role": "assistant", "content": ""}, None)
            chunk = first
            while True:
                # every chunk counts the answer's tokens so far: a deadline that cuts the answer short
                # still reports (and counts) the tokens the client got
                num_tokens = max(num_tokens, chunk.num_tokens)
                prompt_tokens = chunk.prompt_tokens or prompt_tokens
                if chunk.text:
                    parts.append(chunk.text)
                    so_far = None
                    if turn.continuous_usage and not chunk.finish_reason:
                        so_far = responses.usage(chunk.prompt_tokens, chunk.num_tokens)
                    yield responses.sse(head, {"content": chunk.text}, None, so_far)
                if chunk.finish_reason:
                    finish = chunk.finish_reason
                    break
                try:
                    if turn.heartbeat_s:
                        # the next chunk as a task, so that heartbeats can go out while it is slow
                        waiting = asyncio.ensure_future(it.__anext__())
                        async for beat in _heartbeats(waiting, turn.heartbeat_s, deadline):
                            yield beat
                        chunk, waiting = waiting.result(), None
                    else:
                        async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                            chunk = await it.__anext__()
                except TimeoutError:
                    # The deadline cut the answer short: the client gets what came, ended as
                    # "length", but it is an error for the metrics (and the canary analysis).
                    finish, timed_out = "length", True
                    self.breaker.record_failure()
                    break
                now = time.monotonic()
                self.metrics.itl.labels(self.name).observe(now - last)
                last = now
            if not timed_out:
                self.breaker.record_success()
            turn.trace.answered(finish, prompt_tokens, num_tokens)
            if timed_out:
                turn.trace.failed("timeout")
            used = responses.usage(prompt_tokens, num_tokens)
            yield responses.sse(head, {}, "length" if finish == "length" else "stop", used)
            if not timed_out:
                # Stored before [DONE]: a client that saw a turn end finds it in its next turn's history.
                # The store may take seconds (it retries while Redis restarts): a stream that asked for
                # heartbeats gets them meanwhile, or the relay would take the wait for a silent replica,
                # end the stream itself and leave the turn unsaved.
                waiting = asyncio.ensure_future(self._remember(turn, "".join(parts)))
                if turn.heartbeat_s:
                    async for beat in _heartbeats(waiting, turn.heartbeat_s):
                        yield beat
                await waiting
                waiting = None
                self._keep(turn, "".join(parts), finish, prompt_tokens, num_tokens)
            yield responses.DONE
            completed = True
        except BackendError as exc:
            self.breaker.record_failure()
            turn.trace.failed("backend_error")
            # No [DONE] and no finish_reason: the answer was cut, and the client must not take it for a
            # whole one. OpenAI's shape for an error inside a stream (its SDK raises it); the stream relay
            # resumes the answer on another replica instead (docs/runtime.md "Streams that survive").
            yield responses.stream_error(f"the model failed part-way ({exc.kind}): the answer is incomplete")
            completed = True
            self.metrics.gen_ai(self.name, time.monotonic() - turn.t0, error="backend_error")
            self._count("error", 200, True)
            return
        finally:
            slot.release()
            if waiting is not None:  # the next chunk or the save, awaited when the client went
                waiting.cancel()
                with contextlib.suppress(BaseException):
                    await waiting
            await _close(it)
            if not completed:
                self.metrics.disconnects.labels(self.name).inc()
                self.breaker.release()
                self._count("client_error", 499, True)
        elapsed = time.monotonic() - turn.t0
        self.metrics.duration.labels(self.name, "true").observe(elapsed)
        self.metrics.tokens.labels(self.name).inc(num_tokens)
        if timed_out:
            self.metrics.gen_ai(self.name, elapsed, error="timeout")
            self._count("error", 200, True)
            return
        self.metrics.gen_ai(self.name, elapsed, ttft=ttft, tokens=num_tokens)
        if num_tokens > 1 and elapsed > ttft:
            self.metrics.tps.labels(self.name).observe(num_tokens / (elapsed - ttft))
        self._count("success", 200, True)


async def _heartbeats(
    task: asyncio.Future, every_s: float, deadline: float | None = None
) -> AsyncIterator[str]:
    """An SSE heartbeat every `every_s` seconds until `task` is done (what a stream waits for: its next
    chunk, the turn's save); TimeoutError when `deadline` (monotonic) comes first. The task stays the
    caller's: to take its result, or to cancel it when the client goes."""
    while not task.done():
        wait_s = every_s
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            wait_s = min(every_s, left)
        await asyncio.wait({task}, timeout=wait_s)
        if not task.done():
            yield responses.HEARTBEAT


class _Slot:
    """One request's place among the in-flight ones (count and gauge), given back exactly once."""

    def __init__(self, pipeline: AnswerSteps):
        self.pipeline = pipeline
        self.held = True
        pipeline.inflight += 1
        pipeline.metrics.inflight.labels(pipeline.name).inc()

    def release(self) -> None:
        """Give the place back (a second call does nothing)."""
        if self.held:
            self.held = False
            self.pipeline.inflight -= 1
            self.pipeline.metrics.inflight.labels(self.pipeline.name).dec()


async def _close(it) -> None:
    """Close a backend stream, whatever it raises."""
    with contextlib.suppress(BaseException):
        await it.aclose()
