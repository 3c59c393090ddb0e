"""The chat API's Prometheus metrics (names are a contract: see docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
TPS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
#: The bucket boundaries OpenTelemetry's GenAI semantic conventions advise for their server metrics.
GEN_AI_LATENCY_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
GEN_AI_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
#: Attributes of the GenAI server metrics, as Prometheus labels (dots become underscores).
GEN_AI_LABELS = ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_response_model"]


class ApiMetrics:
    """All chat-API metric families on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "chatfleet_requests",
            "Chat completion requests by outcome (success, fallback, client_error, error) and HTTP code",
            ["model", "outcome", "code", "stream"],
            registry=r,
        )
        self.duration = Histogram(
            "chatfleet_request_duration_seconds",
            "Whole response time of chat completions",
            ["model", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "chatfleet_time_to_first_token_seconds",
            "From request arrival to the first generated token",
            ["model", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "chatfleet_inter_token_latency_seconds",
            "Time between streamed chunks of one response",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tps = Histogram(
            "chatfleet_tokens_per_second",
            "Generation speed of one response (completion tokens / time after the first token)",
            ["model"],
            buckets=TPS_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "chatfleet_generated_tokens", "Completion tokens returned to clients", ["model"], registry=r
        )
        self.inflight = Gauge("chatfleet_inflight_requests", "Requests being served", ["model"], registry=r)
        self.active_sessions = Gauge(
            "chatfleet_active_sessions",
            "Conversations seen by this replica within the session TTL",
            ["model"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "chatfleet_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open", ["model"], registry=r
        )
        self.breaker_failure_threshold = Gauge(
            "chatfleet_breaker_failure_threshold",
            "Failed model calls in a row that open the circuit breaker, as now in force (spec.fallback.breaker)",
            ["model"],
            registry=r,
        )
        self.fallback_faq_entries = Gauge(
            "chatfleet_fallback_faq_entries",
            "FAQ entries the fallback answers from, as now in force",
            ["model"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            "chatfleet_breaker_transitions",
            "Breaker state changes, by new state",
            ["model", "state"],
            registry=r,
        )
        self.answer_cache = Counter(
            "chatfleet_answer_cache_requests",
            "First-turn questions the answer cache could serve (spec.runtime.answerCache), by result (hit, miss)",
            ["model", "result"],
            registry=r,
        )
        self.answer_cache_entries = Gauge(
            "chatfleet_answer_cache_entries", "Answers the answer cache keeps", ["model"], registry=r
        )
        self.fallbacks = Counter(
            "chatfleet_fallback_responses",
            "Answers served from the FAQ or fallback text, by reason and source",
            ["model", "reason", "source"],
            registry=r,
        )
        self.fallback_reloads = Counter(
            "chatfleet_fallback_settings_reloads",
            "New contents of the fallback settings file (CHATFLEET_FALLBACK_FILE), by result: applied, "
            "or invalid (the last good settings kept)",
            ["model", "result"],
            registry=r,
        )
        self.session_errors = Counter(
            "chatfleet_session_store_errors",
            "Redis operations that failed (the turn was answered without history)",
            ["model", "op"],
            registry=r,
        )
        self.session_from_replica = Counter(
            "chatfleet_session_history_from_replica",
            "Turns whose history came from this replica's own copy: restored (Redis had lost it, the copy was "
            "put back) or replica (Redis could not be read)",
            ["model", "source"],
            registry=r,
        )
        self.triton_up = Gauge(
            "chatfleet_triton_metrics_up",
            "1 when the last /metrics scrape could include Triton's metrics (re-exported), else 0",
            ["model"],
            registry=r,
        )
        self.draining = Gauge(
            "chatfleet_draining",
            "1 while this replica drains (going away: finishing its streams, readiness failed), else 0",
            ["model"],
            registry=r,
        )
        self.drain_refused = Counter(
            "chatfleet_drain_refused",
            "Chat requests refused (503) while draining: they could not finish before the pod must exit",
            ["model"],
            registry=r,
        )
        self.open_dialogues = Gauge(
            "chatfleet_open_dialogues",
            "Conversations with a turn on this replica within CHATFLEET_DIALOGUE_IDLE_SECONDS",
            ["model"],
            registry=r,
        )
        self.revision_switches = Counter(
            "chatfleet_dialogue_revision_switches",
            "Turns answered by this revision whose previous stored turn another revision answered",
            ["model"],
            registry=r,
        )
        self.shadow_requests = Counter(
            "chatfleet_shadow_requests",
            "Mirrored chat requests on the shadow port, by outcome: answered (by the model), error (no "
            "answer from the model: a failure, a 4xx or a fallback), dropped (over the shadow concurrency "
            "or draining: not attempted)",
            ["model", "outcome"],
            registry=r,
        )
        # OpenTelemetry's GenAI server metrics (semantic conventions, development status), under the names
        # their OpenTelemetry-to-Prometheus translation gives, so that dashboards and tools built on them
        # (gen_ai.server.request.duration, .time_to_first_token, .time_per_output_token) read this pod too.
        self.gen_ai_duration = Histogram(
            "gen_ai_server_request_duration_seconds",
            "GenAI server request duration (to the last output token); error_type set when it failed",
            [*GEN_AI_LABELS, "error_type"],
            buckets=GEN_AI_LATENCY_BUCKETS,
            registry=r,
        )
        self.gen_ai_ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time to generate the first token, for successful responses",
            GEN_AI_LABELS,
            buckets=GEN_AI_LATENCY_BUCKETS,
            registry=r,
        )
        self.gen_ai_tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Time per output token generated after the first token, for successful streamed responses",
            GEN_AI_LABELS,
            buckets=GEN_AI_TPOT_BUCKETS,
            registry=r,
        )
        self.disconnects = Counter(
            "chatfleet_client_disconnects",
            "Streams whose client went away before the end",
            ["model"],
            registry=r,
        )

    def gen_ai(
        self, model: str, elapsed: float, *, ttft: float | None = None, tokens: int = 0, error: str = ""
    ) -> None:
        """Record one chat request in the GenAI server metrics: its duration (with `error` when it failed),
        and for a success its time to first token and, given the first token's time and more than one
        token, its time per output token after the first. Both model labels are the served model's name,
        never the request's `model` text (a user's string would make a label of unbounded cardinality)."""
        labels = ("chat", model, model)
        self.gen_ai_duration.labels(*labels, error).observe(elapsed)
        if error or ttft is None:
            return
        self.gen_ai_ttft.labels(*labels).observe(ttft)
        if tokens > 1 and elapsed > ttft:
            self.gen_ai_tpot.labels(*labels).observe((elapsed - ttft) / (tokens - 1))
