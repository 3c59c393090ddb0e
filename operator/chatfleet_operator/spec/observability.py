"""spec.observability: the telemetry each chat API sends out beside its /metrics (OpenTelemetry traces).

Outside the revision (builders/common.py REVISION_FIELDS): a change starts no release. It changes the pod
template (the chat-api container's OTEL_* environment), so the pods roll through the Deployment's rolling
update like any same-revision template change (docs/operator.md "Operator upgrades"); a spec without the
section builds the template it built before the section existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet_operator.spec.fields import field_value, sub_mapping

#: spec.observability.tracing.samplingRatio's default (the CRD's): one new trace in ten.
DEFAULT_SAMPLING_RATIO = 0.1


@dataclass(frozen=True)
class TracingSpec:
    """spec.observability.tracing: the OTLP/HTTP collector the chat API sends its spans to, and the share
    of new traces it samples (a request whose W3C traceparent says sampled is always traced)."""

    endpoint: str
    """The collector's base URL, e.g. http://otel-collector.monitoring:4318 (the exporter adds /v1/traces)."""
    sampling_ratio: float = DEFAULT_SAMPLING_RATIO

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TracingSpec | None:
        """Parse spec.observability.tracing; None when absent (nothing is traced)."""
        if not d or not d.get("endpoint"):
            return None
        return cls(str(d["endpoint"]), float(field_value(d, "samplingRatio", DEFAULT_SAMPLING_RATIO)))

    def sampler_arg(self) -> str:
        """OTEL_TRACES_SAMPLER_ARG: the ratio as a short decimal, e.g. 0.1 -> '0.1', 1.0 -> '1'."""
        return f"{self.sampling_ratio:g}"


@dataclass(frozen=True)
class ObservabilitySpec:
    """spec.observability: what the chat API sends to the cluster's telemetry (CRD: no defaults but the
    sampling ratio's)."""

    tracing: TracingSpec | None = None
    """spec.observability.tracing; None when absent (the pod template carries no OTEL_* environment)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ObservabilitySpec:
        """Parse spec.observability (absent: nothing sent)."""
        return cls(tracing=TracingSpec.from_dict(sub_mapping(d, "tracing")))
