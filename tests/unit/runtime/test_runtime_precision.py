"""Precision: int8 serves on CPU (torch.ao dynamic quantisation, plain and tied lm_head), the GPU int8
path builds its bitsandbytes config, and fp16/bf16 asked on CPU say that fp32 runs.

Test design: the real loader loads the tiny model from disk in each precision and the real
BatchGenerator / ChatService run on it; no mocks.
"""

from __future__ import annotations

import logging

import pytest
from chatfleet_runtime.engine.generation import BatchGenerator
from chatfleet_runtime.engine.loading import (
    choose_placement,
    int8_gpu_load_kwargs,
    load_model,
    load_tokenizer,
    weights_bytes,
)
from chatfleet_runtime.engine.rows import GenerationRequest, Row
from chatfleet_runtime.engine.service import ChatService, NullObserver, ServiceSettings
from chatfleet_runtime.prompting import SamplingParams, render_prompt


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory):
    from chatfleet_platform.localruntime.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-tied"), tie_word_embeddings=True)


def ids_of(tokenizer, text="Hello there"):
    msgs = [{"role": "user", "content": text}]
    return render_prompt(tokenizer, msgs, max_context_tokens=512, max_new_tokens=16).ids


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_int8_on_cpu_builds_the_generator_and_generates(tiny_model_dir, tied_model_dir, tied):
    import torch

    path = tied_model_dir if tied else tiny_model_dir
    tokenizer = load_tokenizer(path)
    model = load_model(path, choose_placement("int8", "KIND_CPU", cuda_available=False))
    assert isinstance(model.lm_head, torch.ao.nn.quantized.dynamic.Linear)
    assert model.config.tie_word_embeddings is False
    gen = BatchGenerator(model, tokenizer)  # raised on lm_head.weight being a method
    assert gen.vocab_size == len(tokenizer)
    results = gen.generate(
        [GenerationRequest(ids_of(tokenizer, t), SamplingParams(max_new_tokens=6)) for t in ("Hi", "Hello")]
    )
    assert [(r.error, len(r.token_ids), r.finish_reason) for r in results] == [(None, 6, "length")] * 2


def test_int8_weights_take_less_memory_than_fp32(tiny_model_dir):
    fp32 = load_model(tiny_model_dir, choose_placement("fp32", "KIND_CPU", cuda_available=False))
    int8 = load_model(tiny_model_dir, choose_placement("int8", "KIND_CPU", cuda_available=False))
    assert weights_bytes(int8) < 0.6 * weights_bytes(fp32), (weights_bytes(int8), weights_bytes(fp32))


def test_int8_service_answers_through_the_production_load_path(tiny_model_dir):
    # The random tiny model's int8 agreement is about 0.96 (its logits are nearly flat), so it passes 0.9.
    settings = ServiceSettings(
        model_dir=str(tiny_model_dir),
        tokenizer_dir=str(tiny_model_dir),
        precision="int8",
        warmup=True,
        int8_min_agreement=0.9,
    )
    service = ChatService(settings)
    assert service.placement.precision == "int8"
    check = service.precision_check
    assert check is not None and check.prompts == 12 and check.ratio >= 0.9, check
    assert check.positions > 12 * 5 and check.source == "built-in fallback set (12)"
    prep = service.prepare(b'[{"role":"user","content":"hi"}]', b'{"max_tokens":4}')
    (result,) = service.run([prep.request])
    assert result.error is None and len(result.token_ids) == 4


def test_int8_gpu_path_builds_an_8bit_bitsandbytes_config():
    kwargs = int8_gpu_load_kwargs()
    config = kwargs["quantization_config"]
    assert config.load_in_8bit is True and config.load_in_4bit is False
    assert config.quant_method == "bitsandbytes" and kwargs["device_map"] == "cuda"
    assert choose_placement("int8", "KIND_GPU", cuda_available=True).precision == "int8"


class Recorder(NullObserver):
    def __init__(self):
        self.placements = []

    def placement(self, requested, precision, device):
        self.placements.append((requested, precision, device))


@pytest.mark.parametrize("asked", ["fp16", "bf16"])
def test_half_precision_asked_on_cpu_says_fp32_runs(tiny_model_dir, caplog, monkeypatch, asked):
    import torch
    from chatfleet_runtime.engine import loading

    monkeypatch.setattr(loading, "read_cpuinfo", lambda: MILAN)  # no bf16 instructions
    recorder = Recorder()
    settings = ServiceSettings(
        model_dir=str(tiny_model_dir), tokenizer_dir=str(tiny_model_dir), precision=asked, warmup=False
    )
    with caplog.at_level(logging.INFO, logger="chatfleet_runtime.engine.service"):
        service = ChatService(settings, recorder)
    assert recorder.placements == [(asked, "fp32", "cpu")]
    assert next(service.model.parameters()).dtype == torch.float32
    assert f"serving precision fp32 on cpu (asked: {asked})" in caplog.text
    why = {"fp16": "fp16 is not served on CPU", "bf16": "bf16 needs AMX-BF16 or AVX512-BF16 on CPU"}[asked]
    assert f"{why}; using fp32" in caplog.text


def test_bench_precision_row_compares_int8_with_fp32(tiny_model_dir):
    import importlib.util

    from chatfleet_platform.common.config import REPO_ROOT

    spec = importlib.util.spec_from_file_location("runtime_bench", REPO_ROOT / "bench" / "runtime_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.precision_rows(tiny_model_dir, 1, batch=2, max_tokens=4, reps=1)
    assert rows["int8"]["weights_mib"] < rows["fp32"]["weights_mib"]
    assert rows["int8"]["tokens_per_s"] > 0 and rows["int8_vs_fp32"]["memory_ratio"] < 0.6
    assert "int8 weights" in "\n".join(bench.precision_table(rows))


# /proc/cpuinfo excerpts: Sapphire Rapids (AMX-BF16 and AVX512-BF16), Zen 4 (AVX512-BF16 only), and
# this project's CI CPU, an AMD EPYC Milan (AVX2, no bf16 instructions).
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
MILAN = "processor\t: 0\nflags\t\t: fpu avx avx2 f16c fma vaes\n"


@pytest.mark.parametrize(
    ("cpuinfo", "flags"),
    [
        pytest.param(SAPPHIRE_RAPIDS, ["amx_bf16", "avx512_bf16"], id="sapphire-rapids"),
        pytest.param(ZEN4, ["avx512_bf16"], id="zen4"),
        pytest.param(MILAN, [], id="milan"),
        pytest.param("", [], id="no-cpuinfo"),
        pytest.param("model name\t: amx_bf16 in a name\n", [], id="not-the-flags-line"),
    ],
)
def test_cpu_bf16_flags_are_read_from_cpuinfo_text(cpuinfo, flags):
    from chatfleet_runtime.engine.loading import cpu_bf16_flags

    assert cpu_bf16_flags(cpuinfo) == flags


@pytest.mark.parametrize(
    ("asked", "kind", "cuda", "gpu_bf16", "cpu_bf16", "runs"),
    [
        pytest.param("auto", "KIND_GPU", True, True, False, ("cuda", "bf16"), id="auto-ampere"),
        pytest.param("auto", "KIND_GPU", True, False, False, ("cuda", "fp16"), id="auto-turing"),
        pytest.param("auto", "KIND_CPU", False, False, True, ("cpu", "bf16"), id="auto-cpu-amx"),
        pytest.param("auto", "KIND_CPU", False, False, False, ("cpu", "fp32"), id="auto-cpu-avx2"),
        pytest.param("auto", "KIND_GPU", False, False, True, ("cpu", "bf16"), id="auto-gpu-kind-no-cuda"),
        pytest.param("bf16", "KIND_CPU", False, False, True, ("cpu", "bf16"), id="bf16-cpu-amx"),
        pytest.param("bf16", "KIND_CPU", False, False, False, ("cpu", "fp32"), id="bf16-cpu-avx2"),
        pytest.param("bf16", "KIND_GPU", True, False, False, ("cuda", "fp16"), id="bf16-turing"),
        pytest.param("fp16", "KIND_CPU", False, False, True, ("cpu", "fp32"), id="fp16-cpu-amx"),
        pytest.param("fp16", "KIND_GPU", True, True, False, ("cuda", "fp16"), id="fp16-gpu"),
        pytest.param("fp32", "KIND_CPU", False, False, True, ("cpu", "fp32"), id="fp32-cpu"),
        pytest.param("int8", "KIND_CPU", False, False, True, ("cpu", "int8"), id="int8-cpu"),
    ],
)
def test_placement_table(asked, kind, cuda, gpu_bf16, cpu_bf16, runs):
    placement = choose_placement(asked, kind, cuda_available=cuda, bf16_supported=gpu_bf16, cpu_bf16=cpu_bf16)
    assert (placement.device, placement.precision) == runs
    assert bool(placement.reason) == (asked != runs[1] or (kind == "KIND_GPU" and not cuda))


@pytest.mark.parametrize(
    ("asked", "cpuinfo", "runs"),
    [
        pytest.param("auto", SAPPHIRE_RAPIDS, "bf16", id="auto-amx"),
        pytest.param("bf16", ZEN4, "bf16", id="bf16-avx512-bf16"),
        pytest.param("auto", MILAN, "fp32", id="auto-milan"),
    ],
)
def test_service_reads_the_cpu_flags_at_load(tiny_model_dir, monkeypatch, asked, cpuinfo, runs):
    import torch
    from chatfleet_runtime.engine import loading

    monkeypatch.setattr(loading, "read_cpuinfo", lambda: cpuinfo)
    recorder = Recorder()
    settings = ServiceSettings(
        model_dir=str(tiny_model_dir), tokenizer_dir=str(tiny_model_dir), precision=asked, warmup=True
    )
    service = ChatService(settings, recorder)
    assert recorder.placements == [(asked, runs, "cpu")]
    assert next(service.model.parameters()).dtype == loading.torch_dtype(runs)
    prep = service.prepare(b'[{"role":"user","content":"hi"}]', b'{"max_tokens":4}')
    (result,) = service.run([prep.request])
    assert result.error is None and len(result.token_ids) == 4
    assert runs != "bf16" or next(service.model.parameters()).dtype == torch.bfloat16


def test_the_engine_runs_bf16_on_cpu(tiny_model_dir):
    """bf16 weights: the KV budget counts 2 bytes per element, sampling works on float32 logits, rows finish."""
    import torch
    from chatfleet_runtime.engine import sampling

    tokenizer = load_tokenizer(tiny_model_dir)
    fp32 = BatchGenerator(
        load_model(tiny_model_dir, choose_placement("fp32", "KIND_CPU", cuda_available=False)), tokenizer
    )
    bf16_model = load_model(
        tiny_model_dir, choose_placement("bf16", "KIND_CPU", cuda_available=False, cpu_bf16=True)
    )
    assert next(bf16_model.parameters()).dtype == torch.bfloat16
    bf16 = BatchGenerator(bf16_model, tokenizer)
    assert bf16.kv_bytes_per_position() * 2 == fp32.kv_bytes_per_position()
    requests = [
        GenerationRequest(ids_of(tokenizer, "Hi"), SamplingParams(max_new_tokens=6)),
        GenerationRequest(
            ids_of(tokenizer, "Hello"), SamplingParams(max_new_tokens=6, temperature=0.8, seed=3)
        ),
        GenerationRequest(
            ids_of(tokenizer, "Hey"), SamplingParams(max_new_tokens=6, top_p=0.9, top_k=50, seed=4)
        ),
    ]
    results = bf16.generate(requests)
    assert [(r.error, len(r.token_ids)) for r in results] == [(None, 6)] * 3
    # sample() takes the bf16 logits in float32: the same draws as from float32 logits of the same values.
    logits = torch.randn(3, len(tokenizer)).to(torch.bfloat16)
    params = [
        SamplingParams(4),
        SamplingParams(4, temperature=0.7, seed=11),
        SamplingParams(4, top_p=0.8, seed=12),
    ]

    def rows():  # seeded as BatchGenerator.new_row seeds them
        out = [Row(GenerationRequest([1], p), tokenizer, 0.0) for p in params]
        for row in out:
            if row.req.params.seed is not None:
                row.rng = torch.Generator().manual_seed(row.req.params.seed)
        return out

    assert sampling.sample(torch, logits, rows()) == sampling.sample(torch, logits.float(), rows())
