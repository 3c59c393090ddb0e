"""Typed, read-only views of a ChatbotService spec, with every default in one place.

The CRD carries the same defaults (the apiserver fills them in); they are repeated here so that builders
work on partial specs in unit tests and on objects stored before a default existed. A unit test checks
that both sets of defaults agree.

One module per part of the spec (`model`, `runtime`, `resources`, `scaling`, `rollout`, `analysis`, `fallback`,
`observability`, `relay`; what they share in `fields`); this package's top holds the whole spec and the object's
identity, and names every part's types, so callers import them from `chatfleet_operator.spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chatfleet_operator.spec.analysis import (
    AnalysisSpec,
    CustomQuery,
    GoldenExpectation,
    GoldenPromptSpec,
    ProbeSpec,
    PromptsSource,
    QualitySpec,
    RelativeThresholds,
    ShadowSpec,
    Thresholds,
    golden_prompt_of,
)
from chatfleet_operator.spec.fallback import FallbackSpec, FaqAnswer
from chatfleet_operator.spec.fields import (
    DEFAULT_FALLBACK_TEXT,
    DEFAULT_IMAGE,
    DEFAULT_PROMETHEUS,
    field_value,
    sub_mapping,
)
from chatfleet_operator.spec.model import ModelSpec, PvcSource
from chatfleet_operator.spec.observability import DEFAULT_SAMPLING_RATIO, ObservabilitySpec, TracingSpec
from chatfleet_operator.spec.relay import StreamRelaySpec
from chatfleet_operator.spec.resources import ResourcesSpec
from chatfleet_operator.spec.rollout import (
    DEFAULT_CANARY_STEPS,
    CanaryStep,
    RolloutSpec,
    StickyDialogues,
    Strategy,
)
from chatfleet_operator.spec.runtime import (
    AnswerCache,
    Calibration,
    ConfigMapKeyRef,
    DynamicBatching,
    KvCache,
    RedisRef,
    RuntimeSpec,
    Sessions,
)
from chatfleet_operator.spec.scaling import (
    Autoscale,
    AutoscaleTargets,
    ForecastSpec,
    ScalingSpec,
    SloSpec,
    SurgeSpec,
)

__all__ = [
    "DEFAULT_CANARY_STEPS",
    "DEFAULT_FALLBACK_TEXT",
    "DEFAULT_IMAGE",
    "DEFAULT_PROMETHEUS",
    "DEFAULT_SAMPLING_RATIO",
    "AnalysisSpec",
    "AnswerCache",
    "Autoscale",
    "AutoscaleTargets",
    "Calibration",
    "CanaryStep",
    "ChatbotServiceSpec",
    "ConfigMapKeyRef",
    "CustomQuery",
    "DynamicBatching",
    "FallbackSpec",
    "FaqAnswer",
    "ForecastSpec",
    "GoldenExpectation",
    "GoldenPromptSpec",
    "KvCache",
    "ModelSpec",
    "ObjectRef",
    "ObservabilitySpec",
    "PodMetadata",
    "ProbeSpec",
    "PromptsSource",
    "PvcSource",
    "QualitySpec",
    "RedisRef",
    "RelativeThresholds",
    "ResourcesSpec",
    "RolloutSpec",
    "RuntimeSpec",
    "ScalingSpec",
    "Sessions",
    "ShadowSpec",
    "SloSpec",
    "StickyDialogues",
    "Strategy",
    "StreamRelaySpec",
    "SurgeSpec",
    "Thresholds",
    "TracingSpec",
    "golden_prompt_of",
]


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
    fallback: FallbackSpec | None = None
    """spec.fallback; None when absent (outside the revision: no release, docs/api.md)."""
    observability: ObservabilitySpec = field(default_factory=ObservabilitySpec)
    """spec.observability (outside the revision: a change rolls the pods, no release; docs/api.md)."""
    stream_relay: StreamRelaySpec = field(default_factory=StreamRelaySpec)
    """spec.streamRelay (outside the revision: the relay's own objects only; docs/api.md)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ChatbotServiceSpec:
        """Parse a (possibly partial) spec mapping."""
        d = d or {}
        pm = sub_mapping(d, "podMetadata")
        return cls(
            model=ModelSpec.from_dict(sub_mapping(d, "model")),
            runtime=RuntimeSpec.from_dict(sub_mapping(d, "runtime")),
            resources=ResourcesSpec.from_dict(sub_mapping(d, "resources")),
            scaling=ScalingSpec.from_dict(sub_mapping(d, "scaling")),
            rollout=RolloutSpec.from_dict(sub_mapping(d, "rollout")),
            analysis=AnalysisSpec.from_dict(sub_mapping(d, "analysis")),
            pod_metadata=PodMetadata(
                dict(field_value(pm, "labels", {})), dict(field_value(pm, "annotations", {}))
            ),
            fallback=FallbackSpec.from_dict(sub_mapping(d, "fallback")),
            observability=ObservabilitySpec.from_dict(sub_mapping(d, "observability")),
            stream_relay=StreamRelaySpec.from_dict(sub_mapping(d, "streamRelay")),
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
