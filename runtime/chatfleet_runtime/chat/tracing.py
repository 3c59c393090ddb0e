"""OpenTelemetry tracing of the chat API (spec.observability.tracing): one span per chat completion request.

On only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the operator sets it, with the other ``OTEL_*``
variables, from ``spec.observability.tracing``; docs/pod-contract.md). ``configure`` then builds an SDK
``TracerProvider`` of the chat API's own (the process's global provider is left alone, so FastAPI's
built-in telemetry stays off): the sampler from ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``, the
resource from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, and the OTLP/HTTP protobuf span exporter
(``<endpoint>/v1/traces``) behind a batch processor, whose thread alone talks to the collector. Without
the variable, ``configure`` returns ``NO_TRACING``: nothing of the SDK is imported and every request's
trace is ``NO_TRACE``, whose hooks do nothing; so is the trace of a request the sampler leaves out.

A request's span (``RequestTrace``), kind SERVER, is named ``chat <model>`` and follows OpenTelemetry's
GenAI semantic conventions: ``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name``
(``chatfleet``; the conventions replaced ``gen_ai.system`` by it), ``gen_ai.request.model``,
``.max_tokens``, ``.temperature``, ``.top_p``, ``.seed``, ``.stream``, ``gen_ai.response.model``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens``, ``.output_tokens``,
``gen_ai.response.time_to_first_chunk`` (streams, seconds), ``error.type``; HTTP's
``http.response.status_code``; and Chatfleet's ``chatfleet.track``, ``chatfleet.revision``,
``chatfleet.fallback`` (the reason, when the FAQ or fallback text answered), ``chatfleet.cache_hit``.
An incoming W3C ``traceparent`` continues the caller's trace. Status ERROR when the model could not answer
(a fallback answer, a failure, the deadline, a 429 or 5xx); a 4xx is the client's (``error.type`` its
code, status unset), and so is a client that leaves mid-stream (``error.type`` ``client_disconnected``).
A JSON answer's span ends with the answer, a stream's when the stream ends or is abandoned. No prompt,
message or answer text, session id or user is ever put in a span.

The pipeline calls the hooks (``ChatPipeline.chat``, ``chatfleet_runtime.chat.answering``); everything
OpenTelemetry is here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatfleet_runtime.chat.apisettings import ApiSettings
    from chatfleet_runtime.chat.responses import Reply
    from chatfleet_runtime.chat.turn import Turn

log = logging.getLogger("chatfleet.api")

#: The switch: the collector's base URL (OpenTelemetry's own variable; the exporter adds /v1/traces).
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
#: gen_ai.provider.name of every span: no well-known provider serves this model, Chatfleet does.
PROVIDER = "chatfleet"
#: How long the app's shutdown waits for the last spans to reach the collector; later ones are dropped (a
#: collector that answers takes milliseconds; the pod's grace period has 10 s to spare after the drain).
SHUTDOWN_TIMEOUT_S = 2.0
#: The exporter's logger: a batch that cannot be sent is one error line, not a warning per retry.
EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http"
#: W3C trace context headers: the only request headers a span reads.
_CONTEXT_HEADERS = ("traceparent", "tracestate")


class RequestTrace:
    """One request's span; this base does nothing (``NO_TRACE``: tracing off, or the request not sampled).

    Hooks, in a request's order: ``request`` (the validated turn), ``cache_hit``, ``first_chunk``,
    ``answered`` (the model's usage), ``fallback``, ``failed``; then ``end`` with the reply (a stream's
    span ends with the stream), or ``abort`` when the pipeline raised.
    """

    def request(self, turn: Turn) -> None:
        """The validated request: its model and sampling settings."""

    def cache_hit(self) -> None:
        """The answer cache answered."""

    def first_chunk(self, seconds: float) -> None:
        """A stream's first chunk came from the model, `seconds` after the request arrived."""

    def answered(self, finish_reason: str, input_tokens: int, output_tokens: int) -> None:
        """The model's (or the answer cache's kept) answer: its finish reason and token counts."""

    def fallback(self, reason: str) -> None:
        """The FAQ or fallback text answered instead of the model (reason: circuit_open, timeout, ...)."""

    def failed(self, error_type: str) -> None:
        """The model's answer failed part-way (timeout, backend_error)."""

    def end(self, reply: Reply) -> Reply:
        """The reply, its span ended (JSON) or ending with its stream."""
        return reply

    def abort(self, exc: BaseException) -> None:
        """The pipeline raised: the span ends as an error (the exception's type only)."""


NO_TRACE = RequestTrace()


class NoTracing:
    """Tracing off: every request gets ``NO_TRACE``; nothing to close."""

    enabled = False

    def begin(self, headers: Mapping[str, str]) -> RequestTrace:
        """The request's trace: none."""
        return NO_TRACE

    async def close(self) -> None:
        """Nothing to send."""


NO_TRACING = NoTracing()


def configure(settings: ApiSettings, env: Mapping[str, str] | None = None) -> Tracing | NoTracing:
    """The chat API's tracing: on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is
    not ``true``), else ``NO_TRACING`` without importing the SDK. The SDK reads the other ``OTEL_*``
    variables from the process environment."""
    env = os.environ if env is None else env
    if not env.get(ENDPOINT_ENV, "").strip() or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TRACING
    return Tracing(settings)


class Tracing:
    """The chat API's tracer: its own SDK provider, OTLP/HTTP protobuf export in a batch processor."""

    enabled = True

    def __init__(self, settings: ApiSettings):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: settings.model_name}))
        # the sampler from OTEL_TRACES_SAMPLER(_ARG); not the global provider, and no exit hook of its own
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        logging.getLogger(EXPORTER_LOGGER).setLevel(logging.ERROR)
        self.tracer = self.provider.get_tracer("chatfleet_runtime.chat")
        self.propagator = TraceContextTextMapPropagator()
        self.model = settings.model_name
        self.pod_attributes = {
            k: v
            for k, v in {"chatfleet.track": settings.track, "chatfleet.revision": settings.revision}.items()
            if v
        }

    def begin(self, headers: Mapping[str, str]) -> RequestTrace:
        """A chat request arrived: its span, a child of the caller's W3C trace context when it sent one;
        ``NO_TRACE`` when the sampler leaves it out."""
        from opentelemetry.trace import SpanKind

        carrier = {k.lower(): v for k, v in headers.items() if k.lower() in _CONTEXT_HEADERS}
        span = self.tracer.start_span(
            f"chat {self.model}",
            context=self.propagator.extract(carrier) if carrier else None,
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDER,
                **self.pod_attributes,
            },
        )
        if not span.is_recording():
            return NO_TRACE
        return _SpanTrace(span, self.model)

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Send the spans still queued and stop, waiting at most `timeout_s` (a collector that does not answer
        never holds the process: what is not sent by then is dropped)."""
        closing = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        closing.start()
        closing.join(timeout_s)
        if closing.is_alive():
            log.warning("tracing: spans not sent within %.0f s of shutdown are dropped", timeout_s)

    async def close(self) -> None:
        """``shutdown`` off the event loop (the app's shutdown)."""
        await asyncio.to_thread(self.shutdown)


class _SpanTrace(RequestTrace):
    """A sampled request's span (see ``RequestTrace`` for the hooks)."""

    def __init__(self, span: Any, model: str):
        from opentelemetry.trace import StatusCode

        self.span = span
        self.model = model
        """The served model: a validated request names it, and it answers."""
        self._error = StatusCode.ERROR
        self.error_type: str | None = None
        self.ended = False

    def request(self, turn: Turn) -> None:
        params = turn.params
        attributes: dict[str, Any] = {
            "gen_ai.request.model": self.model,
            "gen_ai.request.max_tokens": params["max_tokens"],
            "gen_ai.request.temperature": params["temperature"],
            "gen_ai.request.top_p": params["top_p"],
            "gen_ai.request.stream": turn.stream,
            "chatfleet.cache_hit": False,
        }
        if params.get("seed") is not None:
            attributes["gen_ai.request.seed"] = params["seed"]
        self.span.set_attributes(attributes)

    def cache_hit(self) -> None:
        self.span.set_attribute("chatfleet.cache_hit", True)

    def first_chunk(self, seconds: float) -> None:
        self.span.set_attribute("gen_ai.response.time_to_first_chunk", seconds)

    def answered(self, finish_reason: str, input_tokens: int, output_tokens: int) -> None:
        self.span.set_attributes(
            {
                "gen_ai.response.model": self.model,
                "gen_ai.response.finish_reasons": [finish_reason or "stop"],
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
            }
        )

    def fallback(self, reason: str) -> None:
        self.span.set_attribute("chatfleet.fallback", reason)
        self._fail(f"fallback_{reason}")

    def failed(self, error_type: str) -> None:
        self._fail(error_type)

    def _fail(self, error_type: str, server: bool = True) -> None:
        """error.type (the first one given stays); status ERROR unless the client caused it."""
        if self.error_type is None:
            self.error_type = error_type
            self.span.set_attribute("error.type", error_type)
        if server:
            self.span.set_status(self._error, error_type)

    def end(self, reply: Reply) -> Reply:
        self.span.set_attribute("http.response.status_code", reply.status)
        if reply.status >= 400:
            code = ((reply.body or {}).get("error") or {}).get("code")
            self._fail(code or str(reply.status), server=reply.status >= 500 or reply.status == 429)
        if reply.events is None:
            self._end()
        else:
            reply.events = self._streamed(reply.events)
        return reply

    def abort(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):  # the server gave up on the request: the client left
            self._fail("client_disconnected", server=False)
        else:
            self._fail(type(exc).__name__)
        self._end()

    async def _streamed(self, events: AsyncIterator[str]) -> AsyncIterator[str]:
        """The stream's events, the span ending with them: at the last event, or when the client left
        (the server stops iterating: a cancellation, or the generator closed) or the stream raised."""
        try:
            async for event in events:
                yield event
        except (GeneratorExit, asyncio.CancelledError):
            self._fail("client_disconnected", server=False)
            raise
        except Exception as exc:
            self._fail(type(exc).__name__)
            raise
        finally:
            try:
                close = getattr(events, "aclose", None)
                if close is not None:  # the answer's own clean-up first (its slot, the backend stream)
                    await close()
            finally:
                self._end()

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self.span.end()
