"""spec.analysis: what judges a release (thresholds, custom queries, the probe, the answer-quality gate)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chatfleet_operator.spec.fields import DEFAULT_PROMETHEUS, field_value, optional_float, sub_mapping


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
    e = sub_mapping(p, "expect")
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
            percent=int(field_value(d, "percent", 10)),
            min_requests=int(field_value(d, "minRequests", 20)),
            comparisons_per_interval=int(field_value(d, "comparisonsPerInterval", 8)),
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
        prompts = [g for p in field_value(d, "prompts", ()) if (g := golden_prompt_of(p)) is not None]
        source = sub_mapping(d, "promptsFrom")
        t = sub_mapping(d, "thresholds")
        return cls(
            enabled=bool(d.get("enabled")),
            prompts=tuple(prompts),
            prompts_from=PromptsSource(
                str(source["configMapName"]), str(field_value(source, "key", "prompts.yaml"))
            )
            if source.get("configMapName")
            else None,
            max_tokens=int(field_value(d, "maxTokens", 32)),
            seed=int(field_value(d, "seed", 0)),
            timeout_seconds=float(field_value(d, "timeoutSeconds", 10)),
            compare_with_stable=bool(field_value(d, "compareWithStable", True)),
            min_agreement_percent=float(field_value(t, "minAgreementPercent", 100.0)),
            min_expectations_percent=float(field_value(t, "minExpectationsPercent", 100.0)),
            max_refusal_increase_percent=float(field_value(t, "maxRefusalIncreasePercent", 0.0)),
            max_garbled_increase_percent=float(field_value(t, "maxGarbledIncreasePercent", 0.0)),
            max_length_drift_percent=optional_float(t, "maxLengthDriftPercent")
            if "maxLengthDriftPercent" in t
            else 50.0,
            shadow=ShadowSpec.from_dict(sub_mapping(d, "shadow")),
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
        t = sub_mapping(d, "thresholds")
        rel = sub_mapping(d, "relative")
        return cls(
            prometheus_address=field_value(d, "prometheusAddress", DEFAULT_PROMETHEUS),
            interval_seconds=int(field_value(d, "intervalSeconds", 30)),
            thresholds=Thresholds(
                error_rate_percent=float(field_value(t, "errorRatePercent", 1.0)),
                latency_p99_milliseconds=int(field_value(t, "latencyP99Milliseconds", 5000)),
                time_to_first_token_p99_milliseconds=int(
                    field_value(t, "timeToFirstTokenP99Milliseconds", 1000)
                ),
            ),
            failure_limit=int(field_value(d, "failureLimit", 2)),
            consecutive_error_limit=int(field_value(d, "consecutiveErrorLimit", 4)),
            progress_deadline_seconds=int(field_value(d, "progressDeadlineSeconds", 600)),
            relative=RelativeThresholds(
                error_rate_increase_percent=optional_float(rel, "errorRateIncreasePercent"),
                latency_p99_ratio=optional_float(rel, "latencyP99Ratio"),
                ttft_p99_ratio=optional_float(rel, "ttftP99Ratio"),
            ),
            custom_queries=tuple(
                CustomQuery(
                    name=str(q["name"]),
                    query=str(q["query"]),
                    unit=str(q.get("unit") or ""),
                    max_value=optional_float(q, "max"),
                    min_value=optional_float(q, "min"),
                    max_ratio_to_stable=optional_float(q, "maxRatioToStable"),
                )
                for q in field_value(d, "customQueries", ())
                if isinstance(q, Mapping) and q.get("name") and q.get("query")
            ),
            probe=ProbeSpec.from_dict(sub_mapping(d, "probe")),
            quality=QualitySpec.from_dict(sub_mapping(d, "quality")),
        )
