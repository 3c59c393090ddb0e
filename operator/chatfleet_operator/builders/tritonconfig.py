"""The Triton model configuration, made by the pod contract's writer (chatfleet_contract).

It travels in the pod template: one annotation per model's config.pbtxt, written into the pod by a
downward API volume. No ConfigMap: one object and one write fewer per track, and a pod can never read
another revision's config (a ConfigMap updated in place reaches running pods' volumes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import ROUND_CEILING
from typing import Any

from chatfleet_contract.parameters import WEIGHTS_DIR
from chatfleet_contract.tritonconfig import ChatModelConfig, config_file_name, model_repository_configs

from chatfleet_operator import api
from chatfleet_operator.converge.changes import parse_quantity
from chatfleet_operator.spec import ChatbotServiceSpec

#: Where the pod sees spec.runtime.calibration.configMapRef's key (the Deployment mounts it there).
CALIBRATION_DIR = "/etc/chatfleet/calibration"
CALIBRATION_FILE = f"{CALIBRATION_DIR}/prompts"


def calibration_parameters(spec: ChatbotServiceSpec) -> dict[str, Any]:
    """The int8 check's model parameters: inline prompts as JSON, or the mounted ConfigMap file; {} unless int8.

    e.g. precision int8, calibration.prompts ["Hi"], minAgreement 0.95 ->
    {"calibration_prompts": '["Hi"]', "int8_min_agreement": 0.95}
    """
    rt = spec.runtime
    if rt.precision != "int8":
        return {}
    cal = rt.calibration
    params: dict[str, Any] = {"int8_min_agreement": cal.min_agreement}
    if cal.prompts:
        params["calibration_prompts"] = json.dumps(list(cal.prompts), ensure_ascii=False)
    elif cal.config_map_ref is not None:
        params["calibration_file"] = CALIBRATION_FILE
    return params


def kv_cache_parameters(spec: ChatbotServiceSpec) -> dict[str, Any]:
    """spec.runtime.kvCache as model parameters (quantities in bytes; 0: the runtime derives it).

    e.g. memory 20Gi, prefixCacheMemory 2Gi -> kv_memory_bytes 21474836480, prefix_cache_bytes 2147483648
    """
    kv = spec.runtime.kv_cache
    return {
        "kv_memory_fraction": kv.memory_fraction,
        "kv_memory_bytes": quantity_bytes(kv.memory),
        "prefix_cache_bytes": quantity_bytes(kv.prefix_cache_memory),
        "kv_typical_prompt_tokens": kv.typical_prompt_tokens,
        "admission_queue": kv.admission_queue,
        "admission_wait_ms": kv.admission_wait_milliseconds,
    }


def quantity_bytes(quantity: str | None) -> int:
    """A memory quantity in whole bytes (rounded up); 0 for none.

    >>> quantity_bytes("1Gi"), quantity_bytes("1.5k"), quantity_bytes(None)
    (1073741824, 1500, 0)
    """
    if quantity is None:
        return 0
    value = parse_quantity(quantity)
    if value is None:
        raise ValueError(f"not a quantity: {quantity!r}")
    return int(value.to_integral_value(rounding=ROUND_CEILING))


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
        chat_template=spec.model.chat_template,
        history_turns=rt.sessions.history_turns,
        **calibration_parameters(spec),
        **kv_cache_parameters(spec),
    )


def triton_config_data(spec: ChatbotServiceSpec) -> dict[str, str]:
    """The config.pbtxt of each model (one: ``chat``), keyed by its file name in the pod (the runtime's
    config_file_name())."""
    files = model_repository_configs(chat_model_config(spec))
    return {config_file_name(model): text for model, text in sorted(files.items())}


def triton_config_annotations(spec: ChatbotServiceSpec) -> dict[str, str]:
    """Pod template annotations carrying the generated config.pbtxt files, one per model.

    e.g. {"triton.chatfleet.io/chat.config.pbtxt": 'name: "chat" ...'}. In the template, a config change
    is a template change (the pods roll), and every ReplicaSet keeps the config its pods were made with.
    """
    return {f"{api.TRITON_CONFIG_PREFIX}{key}": text for key, text in triton_config_data(spec).items()}


def triton_config_volume(config: Mapping[str, str]) -> dict[str, Any]:
    """The pod's `triton-config` volume: the downward API writes each of our config annotations (those of
    `triton_config_annotations`, never one a user's podMetadata adds) to its file."""
    items = [
        {
            "path": key[len(api.TRITON_CONFIG_PREFIX) :],
            "fieldRef": {"fieldPath": f"metadata.annotations['{key}']"},
        }
        for key in sorted(config)
    ]
    return {"name": "triton-config", "downwardAPI": {"items": items}}
