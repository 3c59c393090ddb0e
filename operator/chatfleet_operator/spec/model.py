"""spec.model: where the weights come from and how long a context they serve."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet_operator.spec.fields import field_value, sub_mapping


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
        pvc = sub_mapping(d, "pvc")
        return cls(
            uri=d.get("uri") or None,
            pvc=PvcSource(pvc["claimName"], field_value(pvc, "subPath", ""))
            if pvc.get("claimName")
            else None,
            host_path=d.get("hostPath") or None,
            revision=field_value(d, "revision", "main"),
            tokenizer=d.get("tokenizer") or None,
            chat_template=d.get("chatTemplate") or None,
            max_context_tokens=int(field_value(d, "maxContextTokens", 2048)),
            credentials_secret=d.get("credentialsSecret") or None,
        )
