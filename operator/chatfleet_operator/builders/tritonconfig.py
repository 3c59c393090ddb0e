"""The Triton model configuration ConfigMap, made by the pod contract's writer (chatfleet_contract)."""

from __future__ import annotations

from typing import Any

from chatfleet_contract.parameters import WEIGHTS_DIR
from chatfleet_contract.tritonconfig import ChatModelConfig, configmap_key, model_repository_configs

from chatfleet_operator.builders.common import configmap_name, object_meta, short_hash, with_desired_hash
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef


def chat_model_config(spec: ChatbotServiceSpec) -> ChatModelConfig:
    """Translate the CRD spec into the pod contract's ChatModelConfig (KIND_GPU: instances are per GPU)."""
    rt = spec.runtime
    tokenizer = spec.model.tokenizer
    local = bool(tokenizer) and tokenizer.startswith("/")
    return ChatModelConfig(
        model_dir=WEIGHTS_DIR,
        tokenizer_dir=tokenizer if local else None,
        tokenizer_uri=tokenizer if tokenizer and not local else None,
        model_revision=spec.model.revision or None,
        precision=rt.precision,
        kind="KIND_GPU",
        instance_count=rt.instances_per_gpu,
        # Every GPU of the replica gets its instances (one GPU: Triton's default, the config unchanged).
        gpus=tuple(range(spec.resources.gpus_per_replica)) if spec.resources.gpus_per_replica > 1 else (),
        max_batch_size=rt.dynamic_batching.max_batch_size,
        preferred_batch_sizes=rt.dynamic_batching.preferred_batch_sizes,
        max_queue_delay_us=rt.dynamic_batching.max_queue_delay_us,
        max_new_tokens=rt.max_new_tokens,
        max_context_tokens=spec.model.max_context_tokens,
        streaming=rt.streaming,
        chat_template=spec.model.chat_template,
        history_turns=rt.sessions.history_turns,
    )


def triton_config_data(spec: ChatbotServiceSpec) -> dict[str, str]:
    """ConfigMap data: one config.pbtxt per model, keyed by the runtime's configmap_key()."""
    files = model_repository_configs(chat_model_config(spec))
    return {configmap_key(model): text for model, text in sorted(files.items())}


def config_hash(data: dict[str, str]) -> str:
    """Hash of the ConfigMap data; stamped on the pod template so a config change rolls the pods."""
    return short_hash(data)


def build_triton_configmap(ref: ObjectRef, spec: ChatbotServiceSpec, track: str = "stable") -> dict[str, Any]:
    """ConfigMap of one track (`<name>-triton`, `<name>-canary-triton`) holding the generated config.pbtxt files."""
    return with_desired_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": object_meta(
                ref, configmap_name(ref, track), {"app.kubernetes.io/component": "triton-config"}
            ),
            "data": triton_config_data(spec),
        }
    )
