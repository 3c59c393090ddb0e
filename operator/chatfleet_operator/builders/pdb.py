"""The PodDisruptionBudget: voluntary evictions take at most one Triton pod at a time.

Only for a ChatbotService that can run more than one pod (fixed replicas > 1, an autoscale range, a warm
pool): on a single pod, `maxUnavailable: 1` allows every eviction, so the object would only cost a
write and a watch entry.
"""

from __future__ import annotations

from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import deployment_name, object_meta, with_desired_hash
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef


def pdb_wanted(spec: ChatbotServiceSpec) -> bool:
    """Whether the spec can run more than one pod; e.g. replicas 1 -> False, 2 -> True, autoscale -> True."""
    scaling = spec.scaling
    return scaling.replicas > 1 or scaling.autoscale is not None


def build_pdb(ref: ObjectRef) -> dict[str, Any]:
    """policy/v1 PDB with maxUnavailable 1 over all tracks of this ChatbotService."""
    return with_desired_hash(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": object_meta(ref, deployment_name(ref)),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": {api.LABEL_SERVICE: ref.name}},
            },
        }
    )
