"""gpusPerReplica > 1: one Triton instance group over every GPU of the pod, each instance on its own GPU.

Test design: no GPU here, so the decisions are pure functions fed fake device counts -- the config
generator (what Triton is told), the operator's translation of the spec, and the loader's device per
instance (what Triton assigns in args['model_instance_device_id'] and the model must honour).
"""

from __future__ import annotations

import json

import pytest
from chatfleet_contract.tritonconfig import ChatModelConfig, render_config_pbtxt
from chatfleet_runtime.engine import loading
from chatfleet_runtime.engine.service import ServiceSettings


def instance_group(text: str) -> str:
    """The instance_group line of a config.pbtxt."""
    return next(line for line in text.splitlines() if line.startswith("instance_group"))


@pytest.mark.parametrize(
    ("gpus", "count", "line"),
    [
        pytest.param((), 1, "instance_group [ { count: 1 kind: KIND_GPU } ]", id="one-gpu-default"),
        pytest.param(
            (0, 1), 1, "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0, 1 ] } ]", id="two-gpus"
        ),
        pytest.param(
            (0, 1, 2, 3), 2, "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1, 2, 3 ] } ]", id="4x2"
        ),
    ],
)
def test_instance_group_lists_every_gpu_of_the_replica(gpus, count, line):
    cfg = ChatModelConfig(kind="KIND_GPU", instance_count=count, gpus=gpus)
    assert instance_group(render_config_pbtxt(cfg)) == line


def test_gpus_are_validated():
    with pytest.raises(ValueError, match="gpus: must be distinct GPU indices"):
        ChatModelConfig(gpus=(0, 0))
    with pytest.raises(ValueError, match="gpus: must be distinct GPU indices"):
        ChatModelConfig(gpus=(-1,))


@pytest.mark.parametrize(("gpus_per_replica", "gpus"), [(1, ()), (2, (0, 1)), (8, tuple(range(8)))])
def test_operator_spec_to_config_gpus(gpus_per_replica, gpus):
    from chatfleet_operator.builders.tritonconfig import chat_model_config
    from chatfleet_operator.spec import ChatbotServiceSpec

    spec = ChatbotServiceSpec.from_dict(
        {"model": {"uri": "hf://o/m"}, "resources": {"gpusPerReplica": gpus_per_replica}}
    )
    assert chat_model_config(spec).gpus == gpus


@pytest.mark.parametrize(
    ("kind", "cuda", "device_id", "count", "expected"),
    [
        pytest.param("KIND_GPU", True, 1, 2, "cuda:1", id="second-instance-on-gpu-1"),
        pytest.param("KIND_GPU", True, 0, 2, "cuda:0", id="first-instance-on-gpu-0"),
        pytest.param("KIND_GPU", True, None, 1, "cuda", id="no-id-given-default-gpu"),
        pytest.param("KIND_GPU", False, 1, 0, "cpu", id="no-cuda"),
        pytest.param("KIND_CPU", True, 1, 2, "cpu", id="cpu-instance"),
    ],
)
def test_instance_device(kind, cuda, device_id, count, expected):
    got = loading.instance_device(kind, cuda_available=cuda, device_id=device_id, device_count=count)
    assert got == expected


def test_instance_device_beyond_the_visible_gpus_is_a_clear_error():
    with pytest.raises(ValueError, match=r"model_instance_device_id 3: only 2 GPU\(s\) visible"):
        loading.instance_device("KIND_GPU", cuda_available=True, device_id=3, device_count=2)


def test_placement_follows_the_instance_device():
    p = loading.choose_placement("fp16", "KIND_GPU", cuda_available=True, device_id=1, device_count=2)
    assert (p.device, p.precision) == ("cuda:1", "fp16")


def test_settings_from_triton_args_carry_the_assigned_device():
    config = {
        "max_batch_size": 8,
        "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0, 1]}],
        "parameters": {"model_dir": {"string_value": "/w"}},
    }
    args = {"model_config": json.dumps(config), "model_instance_kind": "GPU", "model_instance_device_id": "1"}
    s = ServiceSettings.from_triton_args(args)
    assert (s.kind, s.device_id, s.model_dir, s.max_batch_size) == ("KIND_GPU", 1, "/w", 8)


@pytest.fixture
def cudnn_attention():
    """torch's cuDNN-attention switch, put back as it was after the test."""
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield torch.backends.cuda
    torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize(("device", "cudnn_after"), [("cuda", False), ("cuda:1", False), ("cpu", True)])
def test_gpu_placements_leave_cudnn_attention_out(cudnn_attention, device, cudnn_after):
    """cuDNN's attention plans every new shape on the CPU (~2.2 ms a call on an H100, every decode step):
    a GPU replica serves with flash / memory-efficient attention instead; a CPU replica changes nothing."""
    loading.use_attention_kernels(device)
    assert cudnn_attention.cudnn_sdp_enabled() is cudnn_after


def test_the_service_sets_the_attention_kernels_for_its_placement(tiny_model_dir, monkeypatch):
    from chatfleet_runtime.engine.service import ChatService

    seen: list[str] = []
    monkeypatch.setattr(loading, "use_attention_kernels", seen.append)
    ChatService(ServiceSettings(model_dir=str(tiny_model_dir), kind="KIND_GPU", warmup=False))
    assert seen == ["cpu"]  # no GPU here: the placement falls back to the CPU, and says so
