"""The chat API's request pipeline, without HTTP: one object per API process, one method per route.

``ChatPipeline.chat`` runs a chat-completions request through its steps:

1. parse: validate the body (4xx naming the field; ``stream: true`` is a 400 where streaming is turned
   off: ``CHATFLEET_STREAMING=false``) and find the session id;
2. history: load the conversation from Redis (the answer says whether that worked);
3. admit: the breaker and the in-flight limit, else a fallback answer at once;
4. generate: Triton's one model ``chat`` (decoupled: streamed, or ``stream: false`` for one final
   response) within the deadline; a Triton failure or the deadline is a breaker failure and a fallback
   answer, a bad request a 400;
5. answer and save the turn with the revision that answered it (a stream saves it after its last chunk
   and before its [DONE], so a client that saw a turn end finds it in the next turn's history); a turn whose previous one another revision answered counts a revision switch.

Before step 1 the drain (``chatfleet_runtime.chat.drain.Drain``) is asked whether a new request can still
finish before the pod must exit; when it cannot, the request is refused with a 503 at once.

``ChatPipeline.shadow_chat`` runs a mirrored request of a canary's shadow phase (the shadow port) through
the same steps, with these differences: it is refused at once (503) while draining, and with a 429 when
``--shadow-concurrency`` mirrored ones are in flight; only its messages and max_tokens matter (greedy,
seed 0, max_tokens capped at ``--shadow-max-tokens``, never streamed); the history is read but nothing is
saved and the active-session gauges are not touched; and every one the model was asked about leaves a
record (``chatfleet_runtime.chat.shadow.Shadow``), a fallback answer recorded as an error.

It returns a ``Reply`` (``chatfleet_runtime.chat.responses``); ``chatfleet_runtime.chat.api`` sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet_contract.parameters import ModelParameters
from prometheus_client import generate_latest

from chatfleet_runtime.chat import responses
from chatfleet_runtime.chat.answercache import AnswerCache, Cached
from chatfleet_runtime.chat.apisettings import ApiSettings
from chatfleet_runtime.chat.backend import BackendError, Chunk, triton_params
from chatfleet_runtime.chat.breaker import STATE_VALUE, CircuitBreaker, Fallback
from chatfleet_runtime.chat.drain import EXIT_MARGIN_S, Drain
from chatfleet_runtime.chat.metrics import ApiMetrics
from chatfleet_runtime.chat.responses import Reply
from chatfleet_runtime.chat.sessions import ActiveSessions, History, SessionStore, compose
from chatfleet_runtime.chat.shadow import Shadow
from chatfleet_runtime.prompting import (
    RequestError,
    SamplingParams,
    check_openai_fields,
    parse_sampling,
    session_key_from_user,
    validate_messages,
    validate_session_id,
)

log = logging.getLogger("chatfleet.api")

#: Retry-After (seconds) of the 429 answered when the model's KV budget refused a request.
OVERLOADED_RETRY_AFTER_S = 1


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

    @property
    def new_messages(self) -> list[dict[str, str]]:
        """The request's messages without system prompts: what the stored turn and a late fallback use."""
        return [m for m in self.messages if m["role"] != "system"]


class ChatPipeline:
    """The chat API's state (breaker, in-flight count, sessions, metrics) and its request steps."""

    def __init__(
        self,
        settings: ApiSettings,
        backend,
        redis_client=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self.name = name = settings.model_name
        self.metrics = metrics = ApiMetrics()
        self.backend = backend
        self.redis_client = redis_client
        self.store = SessionStore(
            redis_client,
            namespace=name,
            ttl_s=settings.session_ttl_s,
            turns=settings.history_turns,
            on_error=lambda op: metrics.session_errors.labels(name, op).inc(),
        )
        self.active = ActiveSessions(max(settings.session_ttl_s, settings.idle_s), clock=clock)
        """Conversations seen here: active sessions (within the TTL) and open dialogues (within idle_s)."""
        self.drain = Drain(
            settle_s=settings.drain_settle_s,
            grace_s=settings.grace_s,
            request_timeout_s=settings.request_timeout_s,
            clock=clock,
        )
        """The replica's drain; the API counts chat requests in and out of it (middleware.DrainGate)."""
        metrics.draining.labels(name).set(0)
        metrics.drain_refused.labels(name)
        metrics.revision_switches.labels(name)
        self.breaker = CircuitBreaker(
            settings.breaker_failures, settings.breaker_reset_s, on_change=self._breaker_changed
        )
        metrics.breaker_state.labels(name).set(0)
        self.shadow = Shadow(max_tokens=settings.shadow_max_tokens, concurrency=settings.shadow_concurrency)
        """Mirrored requests of a canary's shadow phase: the bound and the records (the shadow port)."""
        for outcome in ("answered", "error", "dropped"):
            metrics.shadow_requests.labels(name, outcome)
        self.fallback = Fallback.from_config(settings.fallback_text, settings.faq)
        self.cache = (
            AnswerCache(
                settings.answer_cache_ttl_s,
                settings.answer_cache_max_entries,
                settings.answer_cache_sampled,
                clock=clock,
            )
            if settings.answer_cache
            else None
        )
        """Answers of repeated first-turn questions (spec.runtime.answerCache); None when off."""
        if self.cache is not None:
            for result in ("hit", "miss"):
                metrics.answer_cache.labels(name, result)
            metrics.answer_cache_entries.labels(name).set(0)
        self.inflight = 0
        """Requests being served (the in-flight limit counts these)."""
        self.ready = False
        """Triton's chat model has been ready once (afterwards the breaker covers outages)."""
        self.max_new_tokens = settings.max_new_tokens or ModelParameters().max_new_tokens
        """The limit on max_tokens: the setting, else the chat model's own once Triton answered."""

    def _breaker_changed(self, old: str, new: str) -> None:
        self.metrics.breaker_state.labels(self.name).set(STATE_VALUE[new])
        self.metrics.breaker_transitions.labels(self.name, new).inc()
        log.warning("circuit breaker %s -> %s", old, new)

    # ---- lifecycle ------------------------------------------------------------------------------

    async def wait_ready(self) -> None:
        """Poll Triton until the chat model is ready; take its max_new_tokens when none is set."""
        while not self.ready:
            ready = await self.backend.ready()
            if ready and self.settings.max_new_tokens is None and hasattr(self.backend, "max_new_tokens"):
                self.max_new_tokens = await self.backend.max_new_tokens() or self.max_new_tokens
            self.ready = ready
            if not ready:
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        """Close the Triton channel and the Redis client (errors ignored: the process is ending)."""
        with contextlib.suppress(Exception):
            await self.backend.close()
        if self.redis_client is not None:
            with contextlib.suppress(Exception):
                await self.redis_client.aclose()

    def begin_drain(self) -> dict[str, Any]:
        """Start draining (idempotent): readiness fails, late requests are refused; the drain's state."""
        if self.drain.begin():
            log.warning(
                "draining: readiness fails, chat requests admitted for %.1f s more, then refused",
                max(0.0, self.settings.grace_s - EXIT_MARGIN_S - self.settings.request_timeout_s),
            )
        self.metrics.draining.labels(self.name).set(1)
        return self.drain.state()

    # ---- the small routes -----------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        """The one model this deployment serves (OpenAI list shape)."""
        return {
            "object": "list",
            "data": [{"id": self.name, "object": "model", "created": 0, "owned_by": "chatfleet"}],
        }

    async def metrics_text(self) -> str:
        """The API's own exposition text, then Triton's (re-exported) when configured."""
        self.metrics.active_sessions.labels(self.name).set(self.active.count(self.settings.session_ttl_s))
        self.metrics.open_dialogues.labels(self.name).set(self.active.count(self.settings.idle_s))
        self.metrics.draining.labels(self.name).set(int(self.drain.draining))
        self.metrics.breaker_state.labels(self.name).set(STATE_VALUE[self.breaker.state])
        triton = await self._triton_metrics()
        return generate_latest(self.metrics.registry).decode() + triton

    async def _triton_metrics(self) -> str:
        """Triton's exposition text ('' when not configured or unreachable within 2 s)."""
        if not self.settings.triton_metrics_url:
            return ""
        import httpx

        try:
            async with httpx.AsyncClient(timeout=2.0) as http:
                resp = await http.get(self.settings.triton_metrics_url)
                resp.raise_for_status()
        except Exception as exc:
            log.warning("Triton metrics not re-exported: %s", exc)
            self.metrics.triton_up.labels(self.name).set(0)
            return ""
        self.metrics.triton_up.labels(self.name).set(1)
        text = resp.text
        return text if text.endswith("\n") else text + "\n"

    # ---- chat completions -----------------------------------------------------------------------

    async def chat(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        """One OpenAI chat-completions request, through steps 1 to 5 (see the module docstring)."""
        t0 = time.monotonic()
        if not self.drain.admit():
            return self._refused()
        turn = await self._prepare(raw, headers, t0)
        if isinstance(turn, Reply):
            return turn
        return await self._answer(turn)

    async def shadow_chat(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        """One mirrored request on the shadow port: refused while draining or over the bound, else steps
        1 to 5 greedily without saving, and recorded (see the module docstring); every reply carries
        ``x-chatfleet-shadow: true``."""
        t0 = time.monotonic()
        reply = await self._shadow_reply(raw, headers, t0)
        reply.headers["x-chatfleet-shadow"] = "true"
        return reply

    async def _shadow_reply(self, raw: bytes, headers: Mapping[str, str], t0: float) -> Reply:
        """The mirrored request's reply; counted by outcome, recorded when the model was asked."""
        count = self.metrics.shadow_requests
        if self.drain.draining:  # a mirror never holds up a going-away pod: refused from the start
            count.labels(self.name, "dropped").inc()
            return responses.draining()
        if not self.shadow.enter():
            count.labels(self.name, "dropped").inc()
            reply = responses.error(
                429,
                f"shadow: {self.shadow.concurrency} mirrored requests are in flight on this pod, the "
                "limit (--shadow-concurrency); this one is dropped",
            )
            reply.body["error"]["code"] = "shadow_dropped"
            return reply
        turn: Turn | Reply | None = None
        try:
            turn = await self._prepare(raw, headers, t0, shadow=True)
            if isinstance(turn, Reply):  # refused before the model was asked: nothing to replay
                count.labels(self.name, "error").inc()
                return turn
            reply = await self._answer(turn)
            answer, error = _answer_or_error(reply)
        except Exception as exc:  # recorded and answered here: a mirror's failure is the canary's
            log.exception("shadow request failed")
            self.breaker.release()
            self._count("error", 500, False)
            answer, error = None, f"{type(exc).__name__}: {exc}"
            reply = responses.error(500, f"shadow: {error}")
        finally:
            self.shadow.leave()
        if isinstance(turn, Turn):
            seconds = time.monotonic() - t0
            self.shadow.record(turn.prompt_messages, turn.params["max_tokens"], answer, error, seconds)
        count.labels(self.name, "answered" if error is None else "error").inc()
        return reply

    async def _prepare(
        self, raw: bytes, headers: Mapping[str, str], t0: float, shadow: bool = False
    ) -> Turn | Reply:
        """Steps 1 and 2: the turn, or the 4xx reply of a body that fails validation. A mirrored request
        (``shadow``) keeps only its messages and max_tokens (capped): greedy, seed 0, not streamed; its
        history is read, the active sessions are not touched, and the turn is not to be saved."""
        # 1. parse
        stream = False
        try:
            body = self._body(raw)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError("stream: must be true or false")
            if stream and not shadow and not self.settings.streaming:
                raise RequestError(
                    "stream: streaming is turned off for this service (spec.runtime.streaming: false); "
                    "send stream: false"
                )
            messages, sampling, sid, ignored = self._parse(body, headers)
        except RequestError as exc:
            self._count("client_error", exc.status, stream and not shadow)
            return responses.error(exc.status, str(exc))
        if shadow:
            stream = False
            sampling = SamplingParams(
                max_new_tokens=min(sampling.max_new_tokens, self.shadow.max_tokens), temperature=0.0, seed=0
            )
        # 2. history
        history_state, prompt_messages, history = "none", messages, History()
        if sid is not None:
            if not shadow:
                self.active.touch(sid)
            history = await self.store.history(sid)
            history_state = "ok" if history.ok else "unavailable"
            prompt_messages = compose(messages, history.messages)
        if ignored:
            log.info("ignored unknown request fields: %s", ", ".join(ignored))
        info: dict[str, Any] = {"history": history_state, "history_turns": history.turns}
        if history.revision is not None:
            info["previous_revision"] = history.revision
        params = triton_params(sampling, sid)
        key = None
        if self.cache is not None and not shadow and not _bypasses_cache(headers):
            key = self.cache.key(messages, params, history.turns, self.settings.revision, self.name)
        return Turn(
            messages,
            prompt_messages,
            params,
            stream,
            sid,
            {**info, "ignored_fields": ignored},
            t0,
            history.revision,
            store=not shadow,
            cache_key=key,
        )

    async def _answer(self, turn: Turn) -> Reply:
        """Steps 3 to 5: admit (breaker, in-flight limit), generate, answer and save. A question the
        answer cache holds is answered from it before step 3 (no breaker, no slot, no Triton)."""
        if self.cache is not None and turn.cache_key is not None:
            kept = self.cache.get(turn.cache_key)
            self.metrics.answer_cache.labels(self.name, "hit" if kept else "miss").inc()
            if kept is not None:
                return await self._from_cache(turn, kept)
        reply = await self._generate(turn)
        if turn.cache_key is not None:
            reply.headers["X-Chatfleet-Cache"] = "miss"
        return reply

    async def _generate(self, turn: Turn) -> Reply:
        """Steps 3 to 5 of a turn the answer cache does not answer."""
        # 3. admit
        if not self.breaker.allow():
            return self._fallback(turn, turn.messages, "circuit_open")
        if self.inflight >= self.settings.max_inflight:
            self.breaker.release()
            return self._fallback(turn, turn.messages, "overloaded")
        # 4. and 5.
        return await (self._stream(turn) if turn.stream else self._complete(turn))

    def _body(self, raw: bytes) -> dict[str, Any]:
        """The request body as a JSON object, within the size limit."""
        if len(raw) > self.settings.max_body_bytes:
            raise RequestError(
                f"body: {len(raw)} bytes is more than the limit {self.settings.max_body_bytes}", 413
            )
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"body: not valid JSON ({getattr(exc, 'msg', exc)})") from exc
        if not isinstance(body, dict):
            raise RequestError("body: must be a JSON object")
        return body

    def _parse(
        self, body: dict[str, Any], headers: Mapping[str, str]
    ) -> tuple[list[dict[str, str]], SamplingParams, str | None, list[str]]:
        """(messages, sampling, session id, ignored fields) of a request body, or RequestError."""
        model = body.get("model", self.name)
        if model != self.name:
            raise RequestError(f"model: {model!r:.80} is not served here (available: {self.name})", 404)
        messages = validate_messages(body.get("messages"))
        ignored = check_openai_fields(body)
        sampling = parse_sampling(body, max_new_tokens_limit=self.max_new_tokens)
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

    def _refused(self) -> Reply:
        """A 503 for a chat request that could not finish before the draining pod must exit."""
        self.metrics.drain_refused.labels(self.name).inc()
        return responses.draining()

    async def _remember(self, turn: Turn, reply: str) -> None:
        """Store the answered turn with this pod's revision; count a revision switch once it is stored."""
        if turn.session_id is None or not turn.store:
            return
        revision = self.settings.revision
        saved = await self.store.append(turn.session_id, turn.new_messages, reply, revision)
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
        """The FAQ or fallback text instead of the model's answer, marked as such."""
        text, source = self.fallback.answer(messages)
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
        try:
            yield responses.sse(head, {"role": "assistant", "content": ""}, None)
            chunk = first
            while True:
                if chunk.text:
                    parts.append(chunk.text)
                    yield responses.sse(head, {"content": chunk.text}, None)
                if chunk.finish_reason:
                    finish, num_tokens = chunk.finish_reason, chunk.num_tokens
                    prompt_tokens = chunk.prompt_tokens
                    break
                try:
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
            used = responses.usage(prompt_tokens, num_tokens)
            yield responses.sse(head, {}, "length" if finish == "length" else "stop", used)
            if not timed_out:
                # Stored before [DONE]: a client that saw a turn end finds it in its next turn's history.
                await self._remember(turn, "".join(parts))
                self._keep(turn, "".join(parts), finish, prompt_tokens, num_tokens)
            yield responses.DONE
            completed = True
        except BackendError:
            self.breaker.record_failure()
            yield responses.sse(head, {}, "stop")
            yield responses.DONE
            completed = True
            self.metrics.gen_ai(self.name, time.monotonic() - turn.t0, error="backend_error")
            self._count("error", 200, True)
            return
        finally:
            slot.release()
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


class _Slot:
    """One request's place among the in-flight ones (count and gauge), given back exactly once."""

    def __init__(self, pipeline: ChatPipeline):
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


#: Request headers that keep a request away from the answer cache: the release analysis asks the model,
#: never the cache (its quality and traffic probes), and so does a client that says no-cache or no-store.
_ANALYSIS_HEADERS = ("x-chatfleet-quality", "x-chatfleet-probe")


def _bypasses_cache(headers: Mapping[str, str]) -> bool:
    """Whether a request must neither be answered from the answer cache nor fill it."""
    lower = {k.lower(): v for k, v in headers.items()}
    if any(lower.get(h) for h in _ANALYSIS_HEADERS):
        return True
    directives = lower.get("cache-control", "").lower()
    return "no-cache" in directives or "no-store" in directives


def _answer_or_error(reply: Reply) -> tuple[str | None, str | None]:
    """(the model's answer, None), or (None, why there is none) for an error reply or a fallback answer.

    >>> _answer_or_error(responses.error(400, "messages: the prompt is too long"))
    (None, 'HTTP 400: messages: the prompt is too long')
    """
    body = reply.body or {}
    if reply.status != 200 or "error" in body:
        return None, f"HTTP {reply.status}: {body.get('error', {}).get('message', '')}"
    meta = body.get("chatfleet", {})
    if meta.get("fallback"):
        return None, f"fallback ({meta.get('reason')})"
    return body["choices"][0]["message"]["content"], None


async def _close(it) -> None:
    """Close a backend stream, whatever it raises."""
    with contextlib.suppress(BaseException):
        await it.aclose()
