"""spec.resources: what one replica asks of a node (GPUs, CPU, memory)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chatfleet_operator.spec.fields import field_value


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
            gpus_per_replica=int(field_value(d, "gpusPerReplica", 1)),
            gpu_product=d.get("gpuProduct") or None,
            cpu=str(field_value(d, "cpu", "4")),
            memory=str(field_value(d, "memory", "32Gi")),
            shm_size=str(field_value(d, "shmSize", "2Gi")),
            node_selector=dict(field_value(d, "nodeSelector", {})),
            tolerations=tuple(dict(t) for t in field_value(d, "tolerations", ())),
        )
