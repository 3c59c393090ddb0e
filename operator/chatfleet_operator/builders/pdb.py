"""The PodDisruptionBudget: voluntary evictions take at most one Triton pod at a time."""

from __future__ import annotations

from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import deployment_name, object_meta, with_desired_hash
from chatfleet_operator.spec import ObjectRef


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
