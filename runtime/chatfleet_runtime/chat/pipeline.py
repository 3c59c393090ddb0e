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

With tracing on (``OTEL_EXPORTER_OTLP_ENDPOINT``), ``chat`` gives each request a span
(``chatfleet_runtime.chat.tracing``): begun on arrival, ended with the reply (a stream's with the stream);
the steps tell it what happened through the turn's ``trace``. Mirrored requests are not traced.

Steps 1 to 3 are here, with the checks of the body and the ``Turn`` they make in
``chatfleet_runtime.chat.turn``; steps 4 and 5, and the answers that are not the model's (the answer
cache's, the fallback), in ``chatfleet_runtime.chat.answering`` (``AnswerSteps``, this class's base).
It returns a ``Reply`` (``chatfleet_runtime.chat.responses``); ``chatfleet_runtime.chat.api`` sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from chatfleet_contract.parameters import ModelParameters
from prometheus_client import generate_latest

from chatfleet_runtime.chat import responses
from chatfleet_runtime.chat.answercache import AnswerCache
from chatfleet_runtime.chat.answering import AnswerSteps
from chatfleet_runtime.chat.apisettings import ApiSettings
from chatfleet_runtime.chat.backend import triton_params
from chatfleet_runtime.chat.breaker import STATE_VALUE, CircuitBreaker, Fallback
from chatfleet_runtime.chat.drain import EXIT_MARGIN_S, Drain
from chatfleet_runtime.chat.livesettings import APPLIED, INVALID, FallbackSettings, LiveSettings
from chatfleet_runtime.chat.metrics import ApiMetrics
from chatfleet_runtime.chat.responses import Reply
from chatfleet_runtime.chat.sessions import ActiveSessions, History, SessionStore, compose
from chatfleet_runtime.chat.shadow import Shadow
from chatfleet_runtime.chat.tracing import NO_TRACING, NoTracing, RequestTrace, Tracing
from chatfleet_runtime.chat.turn import (
    RELAY_HEADER,
    Turn,
    bypasses_cache,
    heartbeat_seconds,
    parse_request,
    read_body,
)
from chatfleet_runtime.prompting import RequestError, SamplingParams, continuous_usage, parse_continuation

log = logging.getLogger("chatfleet.api")

#: A turn's `chatfleet.history`, by where its history came from (sessions.History.source): "ok" (Redis),
#: "restored" (Redis had lost it; this replica's copy was put back), "replica" (Redis could not be read;
#: this replica's copy, without the turns other replicas answered since). "unavailable" and "none" besides.
HISTORY_STATES = {"redis": "ok", "restored": "restored", "replica": "replica"}


class ChatPipeline(AnswerSteps):
    """The chat API's state (breaker, in-flight count, sessions, metrics) and its request steps."""

    def __init__(
        self,
        settings: ApiSettings,
        backend,
        redis_client=None,
        clock: Callable[[], float] = time.monotonic,
        tracing: Tracing | NoTracing = NO_TRACING,
    ):
        self.settings = settings
        self.tracing = tracing
        """The chat requests' spans (chat/tracing.py): ``NO_TRACING`` unless the environment asks for them."""
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
            on_replica=lambda source: metrics.session_from_replica.labels(name, source).inc(),
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
        self._triton_http = None
        """The client of Triton's metrics port, made on the first scrape and kept: making an httpx client
        loads the CA bundle, hundreds of milliseconds of CPU on the event loop that also answers the
        kubelet's probes (a chat-api container with a small CPU limit missed them)."""
        """Mirrored requests of a canary's shadow phase: the bound and the records (the shadow port)."""
        for outcome in ("answered", "error", "dropped"):
            metrics.shadow_requests.labels(name, outcome)
        self.fallback = Fallback.from_config(settings.fallback_text, settings.faq)
        self.live: LiveSettings | None = None
        """The fallback file's poller (CHATFLEET_FALLBACK_FILE); None without one. The API polls it."""
        if settings.fallback_file:
            for result in (APPLIED, INVALID):
                metrics.fallback_reloads.labels(name, result)
            env = FallbackSettings(
                self.fallback.faq, self.breaker.failure_threshold, settings.breaker_reset_s
            )
            self.live = LiveSettings(
                settings.fallback_file,
                env,
                self.fallback,
                self.breaker,
                on_result=lambda result: metrics.fallback_reloads.labels(name, result).inc(),
            )
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
        """Close the Triton channel and the Redis client, and send the last spans (errors ignored: the
        process is ending)."""
        with contextlib.suppress(Exception):
            await self.tracing.close()
        with contextlib.suppress(Exception):
            await self.backend.close()
        if self._triton_http is not None:
            with contextlib.suppress(Exception):
                await self._triton_http.aclose()
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
        self.metrics.breaker_failure_threshold.labels(self.name).set(self.breaker.failure_threshold)
        self.metrics.fallback_faq_entries.labels(self.name).set(len(self.fallback.faq))
        triton = await self._triton_metrics()
        return generate_latest(self.metrics.registry).decode() + triton

    async def _triton_metrics(self) -> str:
        """Triton's exposition text ('' when not configured or unreachable within 2 s)."""
        if not self.settings.triton_metrics_url:
            return ""
        import httpx

        if self._triton_http is None:
            self._triton_http = httpx.AsyncClient(timeout=2.0)
        try:
            resp = await self._triton_http.get(self.settings.triton_metrics_url)
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
        """One OpenAI chat-completions request, through steps 1 to 5 (see the module docstring), in its span."""
        t0 = time.monotonic()
        trace = self.tracing.begin(headers)
        try:
            reply = await self._chat(raw, headers, t0, trace)
        except BaseException as exc:
            trace.abort(exc)
            raise
        return trace.end(reply)

    async def _chat(self, raw: bytes, headers: Mapping[str, str], t0: float, trace: RequestTrace) -> Reply:
        if not self.drain.admit(past_endpoints=bool(headers.get(RELAY_HEADER))):
            return self._refused()
        turn = await self._prepare(raw, headers, t0)
        if isinstance(turn, Reply):
            return turn
        turn.trace = trace
        trace.request(turn)
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
            body = read_body(raw, self.settings.max_body_bytes)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError("stream: must be true or false")
            if stream and not shadow and not self.settings.streaming:
                raise RequestError(
                    "stream: streaming is turned off for this service (spec.runtime.streaming: false); "
                    "send stream: false"
                )
            messages, sampling, sid, ignored = parse_request(body, headers, self.name, self.max_new_tokens)
            continuing = parse_continuation(body, messages) and not shadow
            heartbeat = heartbeat_seconds(headers) if stream and not shadow else 0.0
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
            history_state = HISTORY_STATES[history.source] if history.ok else "unavailable"
            prompt_messages = compose(messages, history.messages)
        if ignored:
            log.info("ignored unknown request fields: %s", ", ".join(ignored))
        info: dict[str, Any] = {"history": history_state, "history_turns": history.turns}
        if history.revision is not None:
            info["previous_revision"] = history.revision
        params = triton_params(sampling, sid, continuing)
        key = None
        if self.cache is not None and not shadow and not continuing and not bypasses_cache(headers):
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
            continuous_usage=continuous_usage(body),
            continuing=continuing,
            heartbeat_s=heartbeat,
        )

    async def _answer(self, turn: Turn) -> Reply:
        """Steps 3 to 5: admit (breaker, in-flight limit), generate, answer and save. A question the
        answer cache holds is answered from it before step 3 (no breaker, no slot, no Triton)."""
        if self.cache is not None and turn.cache_key is not None:
            kept = self.cache.get(turn.cache_key)
            self.metrics.answer_cache.labels(self.name, "hit" if kept else "miss").inc()
            if kept is not None:
                turn.trace.cache_hit()
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

    def _refused(self) -> Reply:
        """A 503 for a chat request the draining pod does not take (`Drain.admit`)."""
        self.metrics.drain_refused.labels(self.name).inc()
        return responses.draining()


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
