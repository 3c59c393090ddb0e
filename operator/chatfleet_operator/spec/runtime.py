"""spec.runtime: the Triton image and how it serves the model (batching, KV cache, precision, sessions,
the answer cache)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chatfleet_operator.spec.fields import DEFAULT_FALLBACK_TEXT, DEFAULT_IMAGE, field_value, sub_mapping


@dataclass(frozen=True)
class DynamicBatching:
    """spec.runtime.dynamicBatching."""

    max_batch_size: int = 256
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 10_000


@dataclass(frozen=True)
class RedisRef:
    """spec.runtime.sessions.redis: a Secret key holding the Redis URL."""

    secret_name: str
    key: str = "url"


@dataclass(frozen=True)
class Sessions:
    """spec.runtime.sessions."""

    history_turns: int = 5
    ttl_seconds: int = 3600
    redis: RedisRef | None = None


@dataclass(frozen=True)
class KvCache:
    """spec.runtime.kvCache: the KV memory (a share of the device after the weights, or a quantity), the
    prefix store's part of it, the prompt length rows are sized for, and the admission queue."""

    memory_fraction: float = 0.9
    memory: str | None = None
    """A quantity (e.g. "20Gi"); wins over memory_fraction."""
    prefix_cache_memory: str | None = None
    """A quantity; None: a tenth of the KV memory (the runtime's default)."""
    typical_prompt_tokens: int = 512
    admission_queue: int = 64
    admission_wait_milliseconds: int = 10_000

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KvCache:
        """Parse spec.runtime.kvCache (quantities given as numbers become strings)."""
        memory, prefix = d.get("memory"), d.get("prefixCacheMemory")
        return cls(
            memory_fraction=float(field_value(d, "memoryFraction", 0.9)),
            memory=None if memory in (None, "") else str(memory),
            prefix_cache_memory=None if prefix in (None, "") else str(prefix),
            typical_prompt_tokens=int(field_value(d, "typicalPromptTokens", 512)),
            admission_queue=int(field_value(d, "admissionQueue", 64)),
            admission_wait_milliseconds=int(field_value(d, "admissionWaitMilliseconds", 10_000)),
        )


@dataclass(frozen=True)
class ConfigMapKeyRef:
    """A key of a ConfigMap in the ChatbotService's namespace."""

    name: str
    key: str = "prompts"


@dataclass(frozen=True)
class Calibration:
    """spec.runtime.calibration: the prompts int8 is checked on, and the agreement it must reach."""

    prompts: tuple[str, ...] = ()
    config_map_ref: ConfigMapKeyRef | None = None
    min_agreement: float = 0.98

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        """Parse spec.runtime.calibration (absent: the runtime's built-in prompts, 0.98)."""
        ref = sub_mapping(d, "configMapRef")
        config_map = (
            ConfigMapKeyRef(ref["name"], field_value(ref, "key", "prompts")) if ref.get("name") else None
        )
        return cls(
            prompts=tuple(field_value(d, "prompts", ())),
            config_map_ref=config_map,
            min_agreement=float(field_value(d, "minAgreement", 0.98)),
        )


@dataclass(frozen=True)
class AnswerCache:
    """spec.runtime.answerCache: repeated first-turn questions answered from each chat API's memory."""

    ttl_seconds: int = 300
    max_entries: int = 1000
    sampled: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AnswerCache | None:
        """Parse spec.runtime.answerCache; None when absent or not enabled."""
        if not d or not d.get("enabled"):
            return None
        return cls(
            int(field_value(d, "ttlSeconds", 300)),
            int(field_value(d, "maxEntries", 1000)),
            bool(field_value(d, "sampled", False)),
        )


@dataclass(frozen=True)
class RuntimeSpec:
    """spec.runtime: the Triton image and how it serves the model."""

    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    precision: str = "auto"
    calibration: Calibration = field(default_factory=Calibration)
    dynamic_batching: DynamicBatching = field(default_factory=DynamicBatching)
    instances_per_gpu: int = 1
    max_new_tokens: int = 256
    streaming: bool = True
    request_timeout_seconds: int = 60
    fallback_text: str = DEFAULT_FALLBACK_TEXT
    answer_cache: AnswerCache | None = None
    sessions: Sessions = field(default_factory=Sessions)
    kv_cache: KvCache = field(default_factory=KvCache)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RuntimeSpec:
        """Parse spec.runtime."""
        db = sub_mapping(d, "dynamicBatching")
        ss = sub_mapping(d, "sessions")
        redis = sub_mapping(ss, "redis")
        return cls(
            image=field_value(d, "image", DEFAULT_IMAGE) or DEFAULT_IMAGE,
            image_pull_policy=field_value(d, "imagePullPolicy", "IfNotPresent"),
            image_pull_secrets=tuple(field_value(d, "imagePullSecrets", ())),
            precision=field_value(d, "precision", "auto"),
            calibration=Calibration.from_dict(sub_mapping(d, "calibration")),
            dynamic_batching=DynamicBatching(
                max_batch_size=int(field_value(db, "maxBatchSize", 256)),
                preferred_batch_sizes=tuple(int(s) for s in field_value(db, "preferredBatchSizes", ())),
                max_queue_delay_us=int(field_value(db, "maxQueueDelayMicroseconds", 10_000)),
            ),
            instances_per_gpu=int(field_value(d, "instancesPerGPU", 1)),
            max_new_tokens=int(field_value(d, "maxNewTokens", 256)),
            streaming=bool(field_value(d, "streaming", True)),
            request_timeout_seconds=int(field_value(d, "requestTimeoutSeconds", 60)),
            fallback_text=field_value(d, "fallbackText", DEFAULT_FALLBACK_TEXT),
            answer_cache=AnswerCache.from_dict(sub_mapping(d, "answerCache")),
            sessions=Sessions(
                history_turns=int(field_value(ss, "historyTurns", 5)),
                ttl_seconds=int(field_value(ss, "ttlSeconds", 3600)),
                redis=RedisRef(redis["secretName"], field_value(redis, "key", "url"))
                if redis.get("secretName")
                else None,
            ),
            kv_cache=KvCache.from_dict(sub_mapping(d, "kvCache")),
        )
