"""The chat API's Prometheus metrics (names are a contract: see docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
TPS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


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
        self.breaker_transitions = Counter(
            "chatfleet_breaker_transitions",
            "Breaker state changes, by new state",
            ["model", "state"],
            registry=r,
        )
        self.fallbacks = Counter(
            "chatfleet_fallback_responses",
            "Answers served from the FAQ or fallback text, by reason and source",
            ["model", "reason", "source"],
            registry=r,
        )
        self.session_errors = Counter(
            "chatfleet_session_store_errors",
            "Redis operations that failed (the turn was answered without history)",
            ["model", "op"],
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
        self.disconnects = Counter(
            "chatfleet_client_disconnects",
            "Streams whose client went away before the end",
            ["model"],
            registry=r,
        )
