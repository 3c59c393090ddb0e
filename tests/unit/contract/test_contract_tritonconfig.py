"""The pod contract: what the operator writes into the Triton config is what the runtime reads back.

Test design: every config is produced by the real writers (the operator's builder from a CRD spec, or
ChatModelConfig directly), rendered to config.pbtxt, and read back through the same path the pod takes:
the launcher's `parse_parameters`, and Triton's JSON model config into `ServiceSettings.from_triton_args`.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from chatfleet_contract.parameters import WEIGHTS_DIR, ModelParameters, read_model_config, schema, to_text
from chatfleet_contract.tritonconfig import (
    MODEL_NAME,
    ChatModelConfig,
    instance_kinds,
    model_repository_configs,
    parse_parameters,
)
from chatfleet_operator.builders.tritonconfig import chat_model_config
from chatfleet_operator.spec import ChatbotServiceSpec
from chatfleet_runtime.engine.service import ServiceSettings

SPECS = [
    pytest.param({"model": {"uri": "hf://o/m"}}, id="minimal"),
    pytest.param(
        {"model": {"uri": "s3://b/m", "tokenizer": "s3://b/tok", "revision": "abc"}}, id="tokenizer-uri"
    ),
    pytest.param(
        {
            "model": {
                "uri": "hf://o/m",
                "tokenizer": "/tok",
                "chatTemplate": "{{ m }}",
                "maxContextTokens": 4096,
            },
            "runtime": {"precision": "bf16", "maxNewTokens": 100, "sessions": {"historyTurns": 9}},
            "resources": {"gpusPerReplica": 2},
        },
        id="everything-set",
    ),
]


def triton_json(pbtxt: str) -> dict:
    """Triton's JSON model config for a config.pbtxt (the fields the model reads)."""
    return {
        "max_batch_size": int(re.search(r"max_batch_size: (\d+)", pbtxt).group(1)),
        "instance_group": [{"kind": kind} for kind in sorted(instance_kinds(pbtxt))],
        "parameters": {k: {"string_value": v} for k, v in parse_parameters(pbtxt).items()},
    }


def parameters_of(settings: ModelParameters) -> ModelParameters:
    """Only the contract's parameter fields of a ModelParameters subclass."""
    return ModelParameters(**{f.name: getattr(settings, f.name) for f in schema()})


@pytest.mark.parametrize("spec", SPECS)
def test_what_the_operator_writes_is_what_the_model_reads(spec):
    cfg = chat_model_config(ChatbotServiceSpec.from_dict(spec))
    pbtxt = model_repository_configs(cfg)[MODEL_NAME]
    args = {"model_config": json.dumps(triton_json(pbtxt)), "model_instance_kind": "GPU"}
    settings = ServiceSettings.from_triton_args(args)
    written = ModelParameters(**{f.name: getattr(cfg, f.name) for f in schema()})
    assert parameters_of(settings) == written
    assert (settings.kind, settings.max_batch_size) == (cfg.kind, cfg.max_batch_size)
    assert settings.to_parameters() == parse_parameters(pbtxt) == cfg.parameters()


@pytest.mark.parametrize("spec", SPECS)
def test_the_tokenizer_the_model_loads_is_the_one_the_spec_names(spec):
    cfg = chat_model_config(ChatbotServiceSpec.from_dict(spec))
    read = ModelParameters.from_parameters(parse_parameters(model_repository_configs(cfg)[MODEL_NAME]))
    assert read.tokenizer_source == (spec["model"].get("tokenizer") or WEIGHTS_DIR)


def test_every_parameter_round_trips_at_a_value_other_than_its_default():
    changed = {
        f.name: (not f.default) if isinstance(f.default, bool) else
        f.default + 7 if isinstance(f.default, int) else
        f.default / 2 if isinstance(f.default, float) else f"/{f.name}-x"
        for f in schema()
    }  # fmt: skip
    cfg = ChatModelConfig(**{**changed, "precision": "fp16"})
    read = ModelParameters.from_parameters(parse_parameters(model_repository_configs(cfg)[MODEL_NAME]))
    assert read == cfg.model_parameters() == parameters_of(cfg)
    assert set(cfg.parameters()) == {f.name for f in schema()}


def test_one_set_of_defaults_for_writer_and_reader():
    empty = ServiceSettings.from_parameters({})
    for f in schema():
        assert getattr(ChatModelConfig(), f.name) == getattr(empty, f.name) == f.default, f.name
    # the writer spells a default-only config with the parameters the operator always writes
    assert parse_parameters(model_repository_configs(ChatModelConfig())[MODEL_NAME]) == {
        "model_dir": WEIGHTS_DIR,
        "tokenizer_dir": WEIGHTS_DIR,
        "precision": "fp32",
        "max_new_tokens": "256",
        "max_context_tokens": "2048",
        "history_turns": "5",
        "prefix_cache_entries": "1024",
    }


def test_extra_parameters_override_the_typed_ones_for_the_reader_too():
    cfg = ChatModelConfig(
        kind="KIND_CPU", extra_parameters={"inflight_batching": "false", "torch_threads": "2"}
    )
    read = ModelParameters.from_parameters(cfg.parameters())
    assert (read.inflight_batching, read.torch_threads) == (False, 2)
    static = model_repository_configs(dataclasses.replace(cfg, preferred_batch_sizes=(4,)))[MODEL_NAME]
    assert "preferred_batch_size: [ 4 ]" in static  # static batching: the preferred sizes stay


@pytest.mark.parametrize("spec", SPECS)
def test_the_repository_holds_exactly_one_model_decoupled(spec):
    """One engine per replica, one copy of the weights: the repository is the decoupled `chat` alone,
    whatever the spec (streaming off included), serving streamed and non-streamed requests."""
    for streaming in (True, False):
        body = {**spec, "runtime": {**spec.get("runtime", {}), "streaming": streaming}}
        files = model_repository_configs(chat_model_config(ChatbotServiceSpec.from_dict(body)))
        assert list(files) == [MODEL_NAME] == ["chat"]
        assert files[MODEL_NAME].startswith('name: "chat"\n')
        assert "model_transaction_policy { decoupled: true }" in files[MODEL_NAME]


def test_read_model_config_of_an_empty_config():
    assert read_model_config({}) == ({}, "KIND_CPU", 1)


def test_the_parameter_table_in_the_pod_contract_is_the_schema():
    from chatfleet_platform.common.config import REPO_ROOT

    text = (REPO_ROOT / "docs" / "pod-contract.md").read_text()
    rows = re.findall(r"^  \| `(\w+)` \| (.+?) \| (always|when not the default) \|$", text, re.M)
    assert [name for name, _, _ in rows] == [f.name for f in schema()]
    for (name, default, written), f in zip(rows, schema(), strict=True):
        assert (written == "always") == bool(f.metadata.get("always")), name
        if f.default is not None:
            assert default == f"`{to_text(f.default)}`", name
