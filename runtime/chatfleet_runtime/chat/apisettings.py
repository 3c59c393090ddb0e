"""The chat API's settings, read from the pod's environment (names in docs/pod-contract.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_FALLBACK = "Sorry, the assistant is busy right now. Please try again in a moment."


def _flag(value: str) -> bool:
    """An environment flag: false only when it says so ("false", "0", "no", "off"; any case).

    >>> _flag("false"), _flag("True"), _flag("0")
    (False, True, False)
    """
    return value.strip().lower() not in ("false", "0", "no", "off")


@dataclass(frozen=True)
class ApiSettings:
    """Chat API settings (environment names in docs/pod-contract.md)."""

    model_name: str = "chat"
    triton_grpc: str = "127.0.0.1:8001"
    redis_url: str | None = None
    session_ttl_s: int = 3600
    history_turns: int = 5
    request_timeout_s: float = 30.0
    fallback_text: str = DEFAULT_FALLBACK
    faq: str | None = None
    max_new_tokens: int | None = None
    """Limit on max_tokens; None reads the chat model's `max_new_tokens` parameter from Triton (else its default)."""
    streaming: bool = True
    """Whether `stream: true` requests are served (spec.runtime.streaming); false answers them 400 naming
    `stream`. The model itself serves both kinds either way (one decoupled model)."""
    max_inflight: int = 256
    breaker_failures: int = 3
    breaker_reset_s: float = 5.0
    fallback_file: str | None = None
    """A JSON file of FAQ and breaker settings that may change while the API runs (the pod annotation
    ``chatfleet.io/fallback`` through a downward API volume); its absent keys take the three settings
    above (chat/livesettings.py). None: no file, those settings only."""
    fallback_reload_s: float = 2.0
    """How often the fallback file is read again."""
    max_body_bytes: int = 1_000_000
    track: str | None = None
    """The pod's release track (stable, canary, preview), echoed as `x-chatfleet-track`."""
    revision: str | None = None
    """The pod's revision hash, echoed as `x-chatfleet-revision`."""
    triton_metrics_url: str | None = None
    """Triton's metrics endpoint, re-exported on this API's /metrics (None: not re-exported)."""
    drain_settle_s: float = 5.0
    """A drain waits this long after it began and after the last chat request arrived (endpoint removal
    reaching kube-proxy and the gateway)."""
    drain_grace_s: float | None = None
    """The pod's termination grace period; None: request timeout + settle + 10 (what the operator sets)."""
    dialogue_idle_s: float | None = None
    """A dialogue without a turn for this long is no longer open; None: the session TTL."""
    keep_alive_s: float = 620.0
    """How long an idle keep-alive connection stays open. Longer than any proxy in front keeps its idle
    upstream connections (Traefik 90 s, nginx 60 s, cloud load balancers up to 600 s), so the proxy, never
    this server, closes an idle one: a server that closes first (uvicorn's default is 5 s) races the
    proxy's next request on that connection."""
    admin_port: int = 8082
    """The admin port (``--admin-port``): probes, the drain (the pod itself only) and the shadow records
    (the operator); never on the user path (docs/security.md "Ports")."""
    metrics_port: int = 8090
    """The scrape port (``--metrics-port``): ``GET /metrics`` and nothing else, for Prometheus."""
    shadow_port: int = 0
    """The shadow port (``--shadow-port``): mirrored chat requests of a canary's shadow phase and the
    records endpoint; 0 serves none (docs/runtime.md "Shadow traffic")."""
    shadow_max_tokens: int = 64
    """A mirrored request's max_tokens is at most this (``--shadow-max-tokens``)."""
    shadow_concurrency: int = 2
    """Mirrored generations in flight per pod (``--shadow-concurrency``); one more is refused with 429."""
    answer_cache: bool = False
    """Answer repeated first-turn questions from memory (spec.runtime.answerCache; chat/answercache.py)."""
    answer_cache_ttl_s: float = 300.0
    """Seconds a kept answer may be served."""
    answer_cache_max_entries: int = 1000
    """Answers kept at most (the least recently used go first)."""
    answer_cache_sampled: bool = False
    """Also keep and serve answers of sampled requests (temperature > 0): the same question then always
    gets the same sampled answer."""

    @property
    def grace_s(self) -> float:
        """The pod's grace period: the setting, else request timeout + settle + 10 s."""
        if self.drain_grace_s is not None:
            return self.drain_grace_s
        return self.request_timeout_s + self.drain_settle_s + 10

    @property
    def idle_s(self) -> float:
        """How long a dialogue stays open after its last turn: the setting, else the session TTL."""
        return self.session_ttl_s if self.dialogue_idle_s is None else self.dialogue_idle_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ApiSettings:
        """Settings from CHATFLEET_* environment variables, then explicit overrides."""
        env = os.environ if env is None else env
        pick = {
            "model_name": ("CHATFLEET_MODEL_NAME", str),
            "redis_url": ("CHATFLEET_REDIS_URL", str),
            "session_ttl_s": ("CHATFLEET_SESSION_TTL_SECONDS", int),
            "history_turns": ("CHATFLEET_HISTORY_TURNS", int),
            "request_timeout_s": ("CHATFLEET_REQUEST_TIMEOUT_SECONDS", float),
            "fallback_text": ("CHATFLEET_FALLBACK_TEXT", str),
            "faq": ("CHATFLEET_FAQ", str),
            "max_new_tokens": ("CHATFLEET_MAX_NEW_TOKENS", int),
            "streaming": ("CHATFLEET_STREAMING", _flag),
            "max_inflight": ("CHATFLEET_MAX_INFLIGHT", int),
            "breaker_failures": ("CHATFLEET_BREAKER_FAILURES", int),
            "breaker_reset_s": ("CHATFLEET_BREAKER_RESET_SECONDS", float),
            "fallback_file": ("CHATFLEET_FALLBACK_FILE", str),
            "fallback_reload_s": ("CHATFLEET_FALLBACK_RELOAD_SECONDS", float),
            "track": ("CHATFLEET_TRACK", str),
            "revision": ("CHATFLEET_REVISION", str),
            "triton_metrics_url": ("CHATFLEET_TRITON_METRICS_URL", str),
            "drain_settle_s": ("CHATFLEET_DRAIN_SETTLE_SECONDS", float),
            "drain_grace_s": ("CHATFLEET_DRAIN_GRACE_SECONDS", float),
            "dialogue_idle_s": ("CHATFLEET_DIALOGUE_IDLE_SECONDS", float),
            "keep_alive_s": ("CHATFLEET_KEEP_ALIVE_SECONDS", float),
            "answer_cache": ("CHATFLEET_ANSWER_CACHE", _flag),
            "answer_cache_ttl_s": ("CHATFLEET_ANSWER_CACHE_TTL_SECONDS", float),
            "answer_cache_max_entries": ("CHATFLEET_ANSWER_CACHE_MAX_ENTRIES", int),
            "answer_cache_sampled": ("CHATFLEET_ANSWER_CACHE_SAMPLED", _flag),
        }
        values: dict[str, Any] = {}
        for field_name, (var, kind) in pick.items():
            if env.get(var):
                values[field_name] = kind(env[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
