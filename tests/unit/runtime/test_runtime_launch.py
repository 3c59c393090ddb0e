"""The config generator round trip, repository assembly, the launcher (dry run) and weight loading."""

from __future__ import annotations

import sys

import pytest
from chatfleet_contract.tritonconfig import (
    ChatModelConfig,
    config_file_name,
    model_repository_configs,
    parse_parameters,
)
from chatfleet_runtime.engine import loading
from chatfleet_runtime.launcher import launch
from chatfleet_runtime.launcher.tritonhome import Installation, Ports, command, environment, write_repository


def test_parse_parameters_round_trip():
    cfg = ChatModelConfig(
        model_dir="/w", chat_template='{{ "a\\"b" }}\n', extra_parameters={"torch_threads": "2"}
    )
    params = parse_parameters(model_repository_configs(cfg)["chat"])
    assert params == {k: str(v) for k, v in cfg.parameters().items()}


def test_write_repository_holds_exactly_one_decoupled_model(tmp_path):
    """One engine per replica, one copy of the weights: the repository Triton loads is `chat` alone."""
    repo = write_repository(tmp_path / "repo", model_repository_configs(ChatModelConfig(kind="KIND_CPU")))
    assert sorted(p.name for p in repo.iterdir()) == ["chat"]
    assert (repo / "chat" / "config.pbtxt").read_text().startswith('name: "chat"')
    assert "class TritonPythonModel" in (repo / "chat" / "1" / "model.py").read_text()
    assert "model_transaction_policy { decoupled: true }" in (repo / "chat" / "config.pbtxt").read_text()


def test_command_binds_given_address_and_ports(tmp_path):
    inst = Installation(tmp_path / "tritonserver", tmp_path / "backends", None)
    cmd = command(inst, tmp_path / "repo", Ports(1, 2, 3), "0.0.0.0")
    assert "--http-port=1" in cmd and "--grpc-port=2" in cmd and "--metrics-port=3" in cmd
    assert "--grpc-address=0.0.0.0" in cmd and "--disable-auto-complete-config" in cmd


def test_tritonserver_gets_the_chat_models_readiness_url_for_its_load_watch(tmp_path):
    inst = Installation(tmp_path / "tritonserver", tmp_path / "backends", None)
    env = environment(inst, {}, http="127.0.0.1:8000")
    assert env["CHATFLEET_TRITON_READY_URL"] == "http://127.0.0.1:8000/v2/models/chat/ready"
    assert "CHATFLEET_TRITON_READY_URL" not in environment(inst, {})


def test_launch_dry_run_builds_repository_and_fetches_weights(tmp_path, tiny_model_dir, capsys, monkeypatch):
    weights = tmp_path / "weights"
    config_dir = tmp_path / "cm"
    config_dir.mkdir()
    for model, text in model_repository_configs(
        ChatModelConfig(model_dir=str(weights), kind="KIND_CPU")
    ).items():
        (config_dir / config_file_name(model)).write_text(text)
    monkeypatch.setenv("CHATFLEET_MODEL_URI", f"file://{tiny_model_dir}")
    rc = launch.main(
        [
            f"--config-dir={config_dir}",
            f"--repository={tmp_path / 'repo'}",
            f"--triton-home={tmp_path / 'home'}",
            "--dry-run",
        ]
    )
    assert rc == 0
    assert (weights / "config.json").exists() and (tmp_path / "repo" / "chat" / "1" / "model.py").exists()
    assert "--http-port=8000" in capsys.readouterr().out


def test_launch_with_a_bad_uri_exits_naming_the_field(tmp_path, monkeypatch):
    config_dir = tmp_path / "cm"
    config_dir.mkdir()
    for model, text in model_repository_configs(
        ChatModelConfig(model_dir=str(tmp_path / "weights"), kind="KIND_CPU")
    ).items():
        (config_dir / config_file_name(model)).write_text(text)
    monkeypatch.setenv("CHATFLEET_MODEL_URI", "s3:///no-bucket")
    with pytest.raises(
        SystemExit, match=r"^launch: spec\.model\.uri 's3:///no-bucket': the bucket is missing"
    ):
        launch.main([f"--config-dir={config_dir}", f"--repository={tmp_path / 'repo'}", "--dry-run"])


def test_launch_without_configmap_fails_clearly(tmp_path):
    with pytest.raises(SystemExit, match=r"chat.config.pbtxt is missing"):
        launch.main([f"--config-dir={tmp_path}", "--dry-run"])


@pytest.mark.parametrize(
    ("precision", "kind", "cuda", "bf16", "expected"),
    [
        pytest.param("fp32", "KIND_CPU", False, False, ("cpu", "fp32"), id="cpu-fp32"),
        pytest.param("fp16", "KIND_CPU", False, False, ("cpu", "fp32"), id="cpu-fp16-falls-back"),
        pytest.param("bf16", "KIND_GPU", False, False, ("cpu", "fp32"), id="gpu-asked-no-cuda"),
        pytest.param("int8", "KIND_CPU", False, False, ("cpu", "int8"), id="cpu-int8"),
        pytest.param("fp16", "KIND_GPU", True, True, ("cuda", "fp16"), id="gpu-fp16"),
        pytest.param("bf16", "KIND_GPU", True, False, ("cuda", "fp16"), id="gpu-without-bf16"),
        pytest.param("bf16", "KIND_GPU", True, True, ("cuda", "bf16"), id="gpu-bf16"),
    ],
)
def test_choose_placement(precision, kind, cuda, bf16, expected):
    p = loading.choose_placement(precision, kind, cuda_available=cuda, bf16_supported=bf16)
    assert (p.device, p.precision) == expected


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        pytest.param(
            "ftp://host/model",
            "scheme 'ftp' is not one of file, gs, hf, http, https, oci, s3",
            id="unknown-scheme",
        ),
        pytest.param("/does/not/exist", "is not a folder", id="missing-path"),
    ],
)
def test_resolve_model_path_errors(uri, error):
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        loading.resolve_model_path(uri)


def test_resolve_local_path_and_file_uri(tiny_model_dir):
    assert loading.resolve_model_path(str(tiny_model_dir)) == tiny_model_dir
    assert loading.resolve_model_path(f"file://{tiny_model_dir}") == tiny_model_dir


def test_tokenizer_given_as_uri_is_resolved_like_the_weights(tiny_model_dir):
    from chatfleet_runtime.engine.service import ServiceSettings

    settings = ServiceSettings.from_parameters(
        {"model_dir": "/models/weights", "tokenizer_uri": f"file://{tiny_model_dir}"}
    )
    assert settings.tokenizer_source == f"file://{tiny_model_dir}"
    tokenizer = loading.load_tokenizer(settings.tokenizer_source)
    assert tokenizer.padding_side == "left" and tokenizer.chat_template


def test_int8_on_cpu_quantizes_linear_layers(tiny_model_dir):
    import torch

    model = loading.load_model(tiny_model_dir, loading.Placement("cpu", "int8"))
    kinds = {type(m).__module__ for m in model.modules() if "Linear" in type(m).__name__}
    assert any("quantized" in k for k in kinds)
    with torch.inference_mode():
        assert model(torch.tensor([[0, 5, 6]])).logits.shape[-1] == 1024


def test_tiny_cli(tmp_path):
    from chatfleet_platform.localruntime import tiny

    assert tiny.main([str(tmp_path / "m")]) == 0 and (tmp_path / "m" / "tokenizer.json").exists()
    assert sys.modules["chatfleet_platform.localruntime.tiny"] is tiny


@pytest.mark.parametrize(
    ("extra", "delay", "preferred"),
    [
        pytest.param({}, 0, False, id="inflight-default-no-queue-delay"),
        pytest.param({"inflight_batching": "false"}, 7000, True, id="static-keeps-queue-delay"),
    ],
)
def test_queue_delay_only_in_static_mode(extra, delay, preferred):
    cfg = ChatModelConfig(
        max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_us=7000, extra_parameters=extra
    )
    (text,) = model_repository_configs(cfg).values()
    assert f"max_queue_delay_microseconds: {delay}" in text
    assert ("preferred_batch_size: [ 4 ]" in text) is preferred


GPU_CONFIGS = model_repository_configs(ChatModelConfig(kind="KIND_GPU"))


def _no_cuda() -> int:
    return 0


def test_simulated_gpu_serves_from_cpu():
    """The local platform's device plugin marks its fake GPUs: Triton must not ask for a CUDA device."""
    configs, why = launch.place_instances(GPU_CONFIGS, simulated=True, cuda_devices=_no_cuda)
    assert all("kind: KIND_CPU" in text and "KIND_GPU" not in text for text in configs.values())
    assert "simulated GPU" in why


def test_gpu_config_without_cuda_and_without_marker_fails_loudly(monkeypatch):
    """A real GPU node whose device is not visible must stop the pod, not serve slowly from the CPU."""
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-1234")
    with pytest.raises(SystemExit, match=r"KIND_GPU but no CUDA device is visible.*GPU-1234"):
        launch.place_instances(GPU_CONFIGS, simulated=False, cuda_devices=_no_cuda)


def test_gpu_config_with_cuda_is_kept():
    configs, why = launch.place_instances(GPU_CONFIGS, simulated=False, cuda_devices=lambda: 2)
    assert configs == GPU_CONFIGS and "2 CUDA device(s)" in why


def test_cpu_config_never_probes_cuda():
    cpu = model_repository_configs(ChatModelConfig(kind="KIND_CPU"))

    def probe() -> int:
        raise AssertionError("CUDA probed for a KIND_CPU config")

    assert launch.place_instances(cpu, simulated=False, cuda_devices=probe)[0] == cpu


def test_launch_on_simulated_gpu_writes_kind_cpu(tmp_path, tiny_model_dir, monkeypatch):
    """End to end through main(): the repository Triton loads says KIND_CPU on a simulated GPU."""
    cfg = ChatModelConfig(kind="KIND_GPU", model_dir=str(tiny_model_dir))
    (tmp_path / "cm").mkdir()
    for name, text in model_repository_configs(cfg).items():
        (tmp_path / "cm" / config_file_name(name)).write_text(text)
    monkeypatch.setenv(launch.SIMULATED_GPU_ENV, "1")
    argv = [f"--config-dir={tmp_path / 'cm'}", f"--repository={tmp_path / 'repo'}"]
    assert launch.main([*argv, f"--triton-home={tmp_path / 'home'}", "--dry-run"]) == 0
    assert "kind: KIND_CPU" in (tmp_path / "repo" / "chat" / "config.pbtxt").read_text()


def test_triton_is_ready_only_once_its_metrics_port_listens(tmp_path, monkeypatch):
    """tritonserver answers /v2/health/ready before its metrics port opens; a scrape right after "ready" was
    refused. Ready means both: the HTTP endpoint says 200 and the metrics port accepts a connection."""
    import socket
    import urllib.parse

    from chatfleet_platform.localruntime.testing import readiness_stub
    from chatfleet_runtime.launcher.tritonhome import TritonServer, free_port

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tritonserver").touch()
    monkeypatch.setenv("TRITONSERVER_HOME", str(tmp_path))
    metrics_port = free_port("127.0.0.1")
    with readiness_stub("/v2/health/ready") as base:
        http_port = urllib.parse.urlsplit(base).port
        server = TritonServer(tmp_path / "repo", ports=Ports(http_port, 0, metrics_port))
        assert not server.ready(), "ready while the metrics port is still closed"
        with socket.create_server(("127.0.0.1", metrics_port)):
            assert server.ready()
