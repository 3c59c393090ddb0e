"""Pure builders: typed spec + settings -> Kubernetes manifest dicts. No API calls, no kopf."""

from chatfleet_operator.builders.common import (
    deployment_name,
    desired_hash,
    endpoint,
    owner_reference,
    revision_fields,
    revision_hash,
    selector_labels,
    service_name,
)
from chatfleet_operator.builders.deployment import build_deployment
from chatfleet_operator.builders.hpa import build_hpa
from chatfleet_operator.builders.pdb import build_pdb
from chatfleet_operator.builders.scaledobject import build_scaledobject
from chatfleet_operator.builders.service import build_service, track_service_name
from chatfleet_operator.builders.tritonconfig import chat_model_config, triton_config_annotations

__all__ = [
    "build_deployment",
    "build_hpa",
    "build_pdb",
    "build_scaledobject",
    "build_service",
    "chat_model_config",
    "deployment_name",
    "desired_hash",
    "endpoint",
    "owner_reference",
    "revision_fields",
    "revision_hash",
    "selector_labels",
    "service_name",
    "track_service_name",
    "triton_config_annotations",
]
