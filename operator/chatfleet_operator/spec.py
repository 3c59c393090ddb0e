"""Typed, read-only views of a ChatbotService spec, with every default in one place.

The CRD carries the same defaults (the apiserver fills them in); they are repeated here so that builders
work on partial specs in unit tests and on objects stored before a default existed. A unit test checks
that both sets of defaults agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from chatfleet_operator.defaults import ClusterDefaults

#: What a spec parsed on its own (not the pass's effective spec, chatfleet_operator.defaults) falls back to.
DEFAULT_IMAGE = ClusterDefaults.runtime_image
DEFAULT_FALLBACK_TEXT = "Sorry, I cannot answer right now. Please try again in a moment."
DEFAULT_PROMETHEUS = ClusterDefaults.prometheus_address


def _m(d: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    """Sub-mapping of `d` at `key`, empty when absent or null."""
    value = (d or {}).get(key)
    return value if isinstance(value, Mapping) else {}


def _v(d: Mapping[str, Any], key: str, default: Any) -> Any:
    """Value at `key`, or `default` when absent or null."""
    value = d.get(key)
    return default if value is None else value


@dataclass(frozen=True)
class PvcSource:
    """Weights on a PersistentVolumeClaim."""

    claim_name: str
    sub_path: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """spec.model: where the weights come from and how prompts are shaped."""

    uri: str | None = None
    pvc: PvcSource | None = None
    host_path: str | None = None
    revision: str = "main"
    tokenizer: str | None = None
    chat_template: str | None = None
    max_context_tokens: int = 2048
    credentials_secret: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelSpec:
        """Parse spec.model."""
        pvc = _m(d, "pvc")
        return cls(
            uri=d.get("uri") or None,
            pvc=PvcSource(pvc["claimName"], _v(pvc, "subPath", "")) if pvc.get("claimName") else None,
            host_path=d.get("hostPath") or None,
            revision=_v(d, "revision", "main"),
            tokenizer=d.get("tokenizer") or None,
            chat_template=d.get("chatTemplate") or None,
            max_context_tokens=int(_v(d, "maxContextTokens", 2048)),
            credentials_secret=d.get("credentialsSecret") or None,
        )


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
            memory_fraction=float(_v(d, "memoryFraction", 0.9)),
            memory=None if memory in (None, "") else str(memory),
            prefix_cache_memory=None if prefix in (None, "") else str(prefix),
            typical_prompt_tokens=int(_v(d, "typicalPromptTokens", 512)),
            admission_queue=int(_v(d, "admissionQueue", 64)),
            admission_wait_milliseconds=int(_v(d, "admissionWaitMilliseconds", 10_000)),
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
        ref = _m(d, "configMapRef")
        config_map = ConfigMapKeyRef(ref["name"], _v(ref, "key", "prompts")) if ref.get("name") else None
        return cls(
            prompts=tuple(_v(d, "prompts", ())),
            config_map_ref=config_map,
            min_agreement=float(_v(d, "minAgreement", 0.98)),
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
            int(_v(d, "ttlSeconds", 300)), int(_v(d, "maxEntries", 1000)), bool(_v(d, "sampled", False))
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
        db = _m(d, "dynamicBatching")
        ss = _m(d, "sessions")
        redis = _m(ss, "redis")
        return cls(
            image=_v(d, "image", DEFAULT_IMAGE) or DEFAULT_IMAGE,
            image_pull_policy=_v(d, "imagePullPolicy", "IfNotPresent"),
            image_pull_secrets=tuple(_v(d, "imagePullSecrets", ())),
            precision=_v(d, "precision", "auto"),
            calibration=Calibration.from_dict(_m(d, "calibration")),
            dynamic_batching=DynamicBatching(
                max_batch_size=int(_v(db, "maxBatchSize", 256)),
                preferred_batch_sizes=tuple(int(s) for s in _v(db, "preferredBatchSizes", ())),
                max_queue_delay_us=int(_v(db, "maxQueueDelayMicroseconds", 10_000)),
            ),
            instances_per_gpu=int(_v(d, "instancesPerGPU", 1)),
            max_new_tokens=int(_v(d, "maxNewTokens", 256)),
            streaming=bool(_v(d, "streaming", True)),
            request_timeout_seconds=int(_v(d, "requestTimeoutSeconds", 60)),
            fallback_text=_v(d, "fallbackText", DEFAULT_FALLBACK_TEXT),
            answer_cache=AnswerCache.from_dict(_m(d, "answerCache")),
            sessions=Sessions(
                history_turns=int(_v(ss, "historyTurns", 5)),
                ttl_seconds=int(_v(ss, "ttlSeconds", 3600)),
                redis=RedisRef(redis["secretName"], _v(redis, "key", "url"))
                if redis.get("secretName")
                else None,
            ),
            kv_cache=KvCache.from_dict(_m(d, "kvCache")),
        )


@dataclass(frozen=True)
class ResourcesSpec:
    """spec.resources: GPUs, CPU, memory and placement of each replica."""

    gpus_per_replica: int = 1
    gpu_product: str | None = None
    cpu: str = "4"
    memory: str = "32Gi"
    shm_size: str = "2Gi"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResourcesSpec:
        """Parse spec.resources (quantities given as numbers become strings)."""
        return cls(
            gpus_per_replica=int(_v(d, "gpusPerReplica", 1)),
            gpu_product=d.get("gpuProduct") or None,
            cpu=str(_v(d, "cpu", "4")),
            memory=str(_v(d, "memory", "32Gi")),
            shm_size=str(_v(d, "shmSize", "2Gi")),
            node_selector=dict(_v(d, "nodeSelector", {})),
            tolerations=tuple(dict(t) for t in _v(d, "tolerations", ())),
        )


@dataclass(frozen=True)
class AutoscaleTargets:
    """spec.scaling.autoscale.targets: per-pod averages the HPA keeps under; None = not used."""

    gpu_utilization_percent: int | None = None
    queue_time_milliseconds: int | None = None
    request_latency_milliseconds: int | None = None
    in_flight_requests: int | None = None


@dataclass(frozen=True)
class ForecastSpec:
    """spec.scaling.autoscale.forecast: a replica floor ahead of the forecast demand (docs/autoscaling.md)."""

    enabled: bool = False
    requests_per_replica: float | None = None
    """Requests/s one replica serves within the SLO (required when enabled)."""
    seasonal_period_seconds: int = 86400
    history_seconds: int | None = None
    """History read from Prometheus; None: two seasonal periods."""
    lead_seconds: int | None = None
    """How far ahead the floor looks; None: the measured model-load time + 60 s."""
    max_over_provision_percent: int = 50
    interval_seconds: int = 60

    @property
    def history(self) -> int:
        """Seconds of history read: historySeconds, default two seasonal periods."""
        return self.history_seconds or 2 * self.seasonal_period_seconds

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ForecastSpec:
        """Parse spec.scaling.autoscale.forecast."""
        rpr, hist, lead = d.get("requestsPerReplica"), d.get("historySeconds"), d.get("leadSeconds")
        return cls(
            enabled=bool(d.get("enabled") or False),
            requests_per_replica=None if rpr is None else float(rpr),
            seasonal_period_seconds=int(_v(d, "seasonalPeriodSeconds", 86400)),
            history_seconds=None if hist is None else int(hist),
            lead_seconds=None if lead is None else int(lead),
            max_over_provision_percent=int(_v(d, "maxOverProvisionPercent", 50)),
            interval_seconds=int(_v(d, "intervalSeconds", 60)),
        )


@dataclass(frozen=True)
class Autoscale:
    """spec.scaling.autoscale."""

    min_replicas: int = 1
    max_replicas: int = 4
    targets: AutoscaleTargets = field(default_factory=lambda: AutoscaleTargets(gpu_utilization_percent=80))
    scale_down_stabilization_seconds: int = 300
    forecast: ForecastSpec = field(default_factory=ForecastSpec)
    warm_pool: int = 0
    """warmPool.replicas: standby Ready replicas outside the Service (docs/autoscaling.md)."""

    @property
    def forecasting(self) -> bool:
        """The forecast floor is on (enabled, with the capacity of a replica it divides by)."""
        return self.forecast.enabled and bool(self.forecast.requests_per_replica)


@dataclass(frozen=True)
class ScalingSpec:
    """spec.scaling: fixed replicas, or an autoscale range (then an HPA owns the replica count)."""

    replicas: int = 1
    autoscale: Autoscale | None = None
    replicas_set: bool = False
    """spec.scaling.replicas is present (the HPA's decision, once it has scaled the ChatbotService)."""

    @property
    def warm_pool(self) -> int:
        """Standby replicas asked for (spec.scaling.autoscale.warmPool.replicas; 0 without autoscale)."""
        return self.autoscale.warm_pool if self.autoscale is not None else 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScalingSpec:
        """Parse spec.scaling."""
        a = d.get("autoscale")
        autoscale = None
        if isinstance(a, Mapping):
            t = a.get("targets")
            targets = (
                AutoscaleTargets(
                    gpu_utilization_percent=t.get("gpuUtilizationPercent"),
                    queue_time_milliseconds=t.get("queueTimeMilliseconds"),
                    request_latency_milliseconds=t.get("requestLatencyMilliseconds"),
                    in_flight_requests=t.get("inFlightRequests"),
                )
                if isinstance(t, Mapping) and any(v is not None for v in t.values())
                else AutoscaleTargets(gpu_utilization_percent=80)
            )
            autoscale = Autoscale(
                min_replicas=int(_v(a, "minReplicas", 1)),
                max_replicas=int(_v(a, "maxReplicas", 4)),
                targets=targets,
                scale_down_stabilization_seconds=int(_v(a, "scaleDownStabilizationSeconds", 300)),
                forecast=ForecastSpec.from_dict(_m(a, "forecast")),
                warm_pool=int(_v(_m(a, "warmPool"), "replicas", 0)),
            )
        return cls(
            replicas=int(_v(d, "replicas", 1)),
            autoscale=autoscale,
            replicas_set=d.get("replicas") is not None,
        )


@dataclass(frozen=True)
class CanaryStep:
    """One canary step: shift `weight` percent of traffic, pause, optionally analyse."""

    weight: int
    pause_seconds: int = 60
    analysis: bool = True


DEFAULT_CANARY_STEPS = (CanaryStep(10), CanaryStep(50), CanaryStep(100, 0, True))


class Strategy(StrEnum):
    """spec.rollout.strategy: how a new revision replaces the stable one (release/ has one module each)."""

    CANARY = "canary"
    BLUE_GREEN = "blueGreen"


@dataclass(frozen=True)
class StickyDialogues:
    """spec.rollout.stickyDialogues: keep each dialogue on the revision that answered its first turn."""

    enabled: bool = False
    idle_seconds: int = 300
    """A dialogue with no turn for this long has ended (the old revision is released after this much quiet)."""
    max_drain_seconds: int = 900
    """The longest the old revision keeps serving pinned dialogues after the last step."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StickyDialogues:
        """Parse spec.rollout.stickyDialogues."""
        return cls(
            enabled=bool(d.get("enabled") or False),
            idle_seconds=int(_v(d, "idleSeconds", 300)),
            max_drain_seconds=int(_v(d, "maxDrainSeconds", 900)),
        )


@dataclass(frozen=True)
class RolloutSpec:
    """spec.rollout: the strategy, its parameters, and the GitOps intents (paused, promote, abort)."""

    strategy: Strategy = Strategy.CANARY
    canary_steps: tuple[CanaryStep, ...] = DEFAULT_CANARY_STEPS
    blue_green_auto_promotion: bool = False
    blue_green_auto_promotion_seconds: int = 0
    blue_green_preview_replicas: int = 1
    blue_green_scale_down_delay_seconds: int = 30
    paused: bool = False
    """spec.rollout.paused: hold the release at its step."""
    promote: str = ""
    """spec.rollout.promote: the revision to promote now ('*' any)."""
    abort: str = ""
    """spec.rollout.abort: the revision to roll back now ('*' any)."""
    gpu_capacity: str = "Auto"
    """spec.rollout.gpuCapacity: Surge, ReplaceInPlace, or Auto (surge until a pod finds no GPU)."""
    sticky: StickyDialogues = field(default_factory=StickyDialogues)
    """spec.rollout.stickyDialogues."""
    hostnames: tuple[str, ...] = ()
    """spec.rollout.hostnames: the HTTPRoute's hostnames (none: every hostname its listener admits)."""

    def wants(self, intent: str, revision: str) -> bool:
        """Whether an intent field (self.promote, self.abort) names this revision ('*' names any)."""
        return bool(intent) and intent in (revision, "*")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RolloutSpec:
        """Parse spec.rollout."""
        canary = _m(d, "canary")
        bg = _m(d, "blueGreen")
        steps = canary.get("steps")
        return cls(
            strategy=Strategy(d["strategy"]) if d.get("strategy") in set(Strategy) else Strategy.CANARY,
            canary_steps=tuple(
                CanaryStep(int(s["weight"]), int(_v(s, "pauseSeconds", 60)), bool(_v(s, "analysis", True)))
                for s in steps
            )
            if steps
            else DEFAULT_CANARY_STEPS,
            blue_green_auto_promotion=bool(_v(bg, "autoPromotion", False)),
            blue_green_auto_promotion_seconds=int(_v(bg, "autoPromotionSeconds", 0)),
            blue_green_preview_replicas=int(_v(bg, "previewReplicas", 1)),
            blue_green_scale_down_delay_seconds=int(_v(bg, "scaleDownDelaySeconds", 30)),
            paused=bool(d.get("paused") or False),
            promote=str(d.get("promote") or ""),
            abort=str(d.get("abort") or ""),
            gpu_capacity=str(d.get("gpuCapacity") or "Auto"),
            sticky=StickyDialogues.from_dict(_m(d, "stickyDialogues")),
            hostnames=tuple(str(h) for h in d.get("hostnames") or ()),
        )


@dataclass(frozen=True)
class Thresholds:
    """spec.analysis.thresholds: a measurement over any of these fails a check."""

    error_rate_percent: float = 1.0
    latency_p99_milliseconds: int = 5000
    time_to_first_token_p99_milliseconds: int = 1000


@dataclass(frozen=True)
class RelativeThresholds:
    """spec.analysis.relative: limits relative to the stable track (None = not used)."""

    error_rate_increase_percent: float | None = None
    latency_p99_ratio: float | None = None
    ttft_p99_ratio: float | None = None


@dataclass(frozen=True)
class CustomQuery:
    """One spec.analysis.customQueries entry."""

    name: str
    query: str
    unit: str = ""
    max_value: float | None = None
    min_value: float | None = None
    max_ratio_to_stable: float | None = None


def _opt_float(d: Mapping[str, Any], key: str) -> float | None:
    """Float at `key`, None when absent."""
    value = d.get(key)
    return None if value is None else float(value)


@dataclass(frozen=True)
class ProbeSpec:
    """spec.analysis.probe: test prompts sent to the canary when the analysis saw no traffic."""

    enabled: bool = False
    url: str = ""
    """URL template ({namespace} {service} {track} {domain}); empty: the operator's setting."""
    requests: int = 10
    prompts: tuple[str, ...] = ("Hello!",)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeSpec:
        """Parse spec.analysis.probe."""
        return cls(
            enabled=bool(d.get("enabled")),
            url=str(d.get("url") or ""),
            requests=int(d.get("requests") or 10),
            prompts=tuple(d.get("prompts") or ()) or ("Hello!",),
        )


@dataclass(frozen=True)
class GoldenExpectation:
    """What one golden prompt's answer must be (spec.analysis.quality.prompts[].expect); all optional."""

    contains: tuple[str, ...] = ()
    regex: str | None = None
    must_not_refuse: bool = False
    max_length: int | None = None
    valid_json: bool = False


@dataclass(frozen=True)
class GoldenPromptSpec:
    """One spec.analysis.quality.prompts entry."""

    name: str
    prompt: str
    expect: GoldenExpectation = field(default_factory=GoldenExpectation)


@dataclass(frozen=True)
class PromptsSource:
    """spec.analysis.quality.promptsFrom: a ConfigMap key holding golden prompts (YAML or JSON list)."""

    config_map: str
    key: str = "prompts.yaml"


def golden_prompt_of(p: Any) -> GoldenPromptSpec | None:
    """One golden prompt in the spec's shape ({name, prompt, expect}); None without a name or a prompt."""
    if not isinstance(p, Mapping) or not p.get("name") or not p.get("prompt"):
        return None
    e = _m(p, "expect")
    return GoldenPromptSpec(
        name=str(p["name"]),
        prompt=str(p["prompt"]),
        expect=GoldenExpectation(
            contains=tuple(str(c) for c in e.get("contains") or ()),
            regex=None if e.get("regex") is None else str(e["regex"]),
            must_not_refuse=bool(e.get("mustNotRefuse")),
            max_length=None if e.get("maxLength") is None else int(e["maxLength"]),
            valid_json=bool(e.get("validJSON")),
        ),
    )


@dataclass(frozen=True)
class ShadowSpec:
    """spec.analysis.quality.shadow: live requests mirrored to the canary before it takes any traffic."""

    enabled: bool = False
    percent: int = 10
    """Share of the requests the gateway mirrors to the canary's shadow port."""
    min_requests: int = 20
    """Mirrored requests compared with stable's answers before the shadow phase can pass."""
    comparisons_per_interval: int = 8
    """At most this many mirrored requests are asked of stable per analysis interval (the rest are left)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShadowSpec:
        """Parse spec.analysis.quality.shadow."""
        return cls(
            enabled=bool(d.get("enabled")),
            percent=int(_v(d, "percent", 10)),
            min_requests=int(_v(d, "minRequests", 20)),
            comparisons_per_interval=int(_v(d, "comparisonsPerInterval", 8)),
        )


@dataclass(frozen=True)
class QualitySpec:
    """spec.analysis.quality: golden prompts sent to the canary and to stable every analysis interval."""

    enabled: bool = False
    prompts: tuple[GoldenPromptSpec, ...] = ()
    prompts_from: PromptsSource | None = None
    """A ConfigMap key holding more prompts (read by the operator at each measurement)."""
    max_tokens: int = 32
    seed: int = 0
    timeout_seconds: float = 10.0
    compare_with_stable: bool = True
    """False for a release meant to change answers (new weights): agreement is not checked."""
    min_agreement_percent: float = 100.0
    min_expectations_percent: float = 100.0
    max_refusal_increase_percent: float = 0.0
    max_garbled_increase_percent: float = 0.0
    max_length_drift_percent: float | None = 50.0
    shadow: ShadowSpec = field(default_factory=ShadowSpec)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QualitySpec:
        """Parse spec.analysis.quality (entries without name or prompt are left out; admission refuses them)."""
        prompts = [g for p in _v(d, "prompts", ()) if (g := golden_prompt_of(p)) is not None]
        source = _m(d, "promptsFrom")
        t = _m(d, "thresholds")
        return cls(
            enabled=bool(d.get("enabled")),
            prompts=tuple(prompts),
            prompts_from=PromptsSource(str(source["configMapName"]), str(_v(source, "key", "prompts.yaml")))
            if source.get("configMapName")
            else None,
            max_tokens=int(_v(d, "maxTokens", 32)),
            seed=int(_v(d, "seed", 0)),
            timeout_seconds=float(_v(d, "timeoutSeconds", 10)),
            compare_with_stable=bool(_v(d, "compareWithStable", True)),
            min_agreement_percent=float(_v(t, "minAgreementPercent", 100.0)),
            min_expectations_percent=float(_v(t, "minExpectationsPercent", 100.0)),
            max_refusal_increase_percent=float(_v(t, "maxRefusalIncreasePercent", 0.0)),
            max_garbled_increase_percent=float(_v(t, "maxGarbledIncreasePercent", 0.0)),
            max_length_drift_percent=_opt_float(t, "maxLengthDriftPercent")
            if "maxLengthDriftPercent" in t
            else 50.0,
            shadow=ShadowSpec.from_dict(_m(d, "shadow")),
        )


@dataclass(frozen=True)
class AnalysisSpec:
    """spec.analysis: where metrics come from and what counts as healthy."""

    prometheus_address: str = DEFAULT_PROMETHEUS
    interval_seconds: int = 30
    thresholds: Thresholds = field(default_factory=Thresholds)
    failure_limit: int = 2
    consecutive_error_limit: int = 4
    progress_deadline_seconds: int = 600
    relative: RelativeThresholds = field(default_factory=RelativeThresholds)
    custom_queries: tuple[CustomQuery, ...] = ()
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    quality: QualitySpec = field(default_factory=QualitySpec)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AnalysisSpec:
        """Parse spec.analysis."""
        t = _m(d, "thresholds")
        rel = _m(d, "relative")
        return cls(
            prometheus_address=_v(d, "prometheusAddress", DEFAULT_PROMETHEUS),
            interval_seconds=int(_v(d, "intervalSeconds", 30)),
            thresholds=Thresholds(
                error_rate_percent=float(_v(t, "errorRatePercent", 1.0)),
                latency_p99_milliseconds=int(_v(t, "latencyP99Milliseconds", 5000)),
                time_to_first_token_p99_milliseconds=int(_v(t, "timeToFirstTokenP99Milliseconds", 1000)),
            ),
            failure_limit=int(_v(d, "failureLimit", 2)),
            consecutive_error_limit=int(_v(d, "consecutiveErrorLimit", 4)),
            progress_deadline_seconds=int(_v(d, "progressDeadlineSeconds", 600)),
            relative=RelativeThresholds(
                error_rate_increase_percent=_opt_float(rel, "errorRateIncreasePercent"),
                latency_p99_ratio=_opt_float(rel, "latencyP99Ratio"),
                ttft_p99_ratio=_opt_float(rel, "ttftP99Ratio"),
            ),
            custom_queries=tuple(
                CustomQuery(
                    name=str(q["name"]),
                    query=str(q["query"]),
                    unit=str(q.get("unit") or ""),
                    max_value=_opt_float(q, "max"),
                    min_value=_opt_float(q, "min"),
                    max_ratio_to_stable=_opt_float(q, "maxRatioToStable"),
                )
                for q in _v(d, "customQueries", ())
                if isinstance(q, Mapping) and q.get("name") and q.get("query")
            ),
            probe=ProbeSpec.from_dict(_m(d, "probe")),
            quality=QualitySpec.from_dict(_m(d, "quality")),
        )


@dataclass(frozen=True)
class PodMetadata:
    """spec.podMetadata: labels and annotations copied onto the pod template."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ChatbotServiceSpec:
    """The whole spec of one ChatbotService, defaults applied."""

    model: ModelSpec = field(default_factory=ModelSpec)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    analysis: AnalysisSpec = field(default_factory=AnalysisSpec)
    pod_metadata: PodMetadata = field(default_factory=PodMetadata)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ChatbotServiceSpec:
        """Parse a (possibly partial) spec mapping."""
        d = d or {}
        pm = _m(d, "podMetadata")
        return cls(
            model=ModelSpec.from_dict(_m(d, "model")),
            runtime=RuntimeSpec.from_dict(_m(d, "runtime")),
            resources=ResourcesSpec.from_dict(_m(d, "resources")),
            scaling=ScalingSpec.from_dict(_m(d, "scaling")),
            rollout=RolloutSpec.from_dict(_m(d, "rollout")),
            analysis=AnalysisSpec.from_dict(_m(d, "analysis")),
            pod_metadata=PodMetadata(dict(_v(pm, "labels", {})), dict(_v(pm, "annotations", {}))),
        )


@dataclass(frozen=True)
class ObjectRef:
    """Identity of one ChatbotService: what owner references and names are built from."""

    namespace: str
    name: str
    uid: str
    generation: int = 1

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ObjectRef:
        """Identity from an object body."""
        meta = body.get("metadata", {})
        return cls(meta["namespace"], meta["name"], meta.get("uid", ""), int(meta.get("generation") or 1))
