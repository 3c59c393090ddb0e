"""Precision: int8 serves on CPU (torch.ao dynamic quantisation, plain and tied lm_head), the GPU int8
path builds its bitsandbytes config, and fp16/bf16 asked on CPU say that fp32 runs.

Test design: the real loader loads the tiny model from disk in each precision and the real
BatchGenerator / ChatService run on it; no mocks.
"""

from __future__ import annotations

import logging

import pytest
from chatfleet_runtime.generation import BatchGenerator
from chatfleet_runtime.loading import (
    choose_placement,
    int8_gpu_load_kwargs,
    load_model,
    load_tokenizer,
    weights_bytes,
)
from chatfleet_runtime.prompting import SamplingParams, render_prompt
from chatfleet_runtime.rows import GenerationRequest
from chatfleet_runtime.service import ChatService, ServiceSettings


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
    settings = ServiceSettings(
        model_dir=str(tiny_model_dir), tokenizer_dir=str(tiny_model_dir), precision="int8", warmup=True
    )
    service = ChatService(settings)
    assert service.placement.precision == "int8"
    prep = service.prepare(b'[{"role":"user","content":"hi"}]', b'{"max_tokens":4}')
    (result,) = service.run([prep.request])
    assert result.error is None and len(result.token_ids) == 4


def test_int8_gpu_path_builds_an_8bit_bitsandbytes_config():
    kwargs = int8_gpu_load_kwargs()
    config = kwargs["quantization_config"]
    assert config.load_in_8bit is True and config.load_in_4bit is False
    assert config.quant_method == "bitsandbytes" and kwargs["device_map"] == "cuda"
    assert choose_placement("int8", "KIND_GPU", cuda_available=True).precision == "int8"


class Recorder:
    def __init__(self):
        self.placements = []

    def batch(self, rows, generate_s, tokens):
        pass

    def finished(self, result):
        pass

    def cache(self, cache):
        pass

    def placement(self, requested, precision, device):
        self.placements.append((requested, precision, device))


@pytest.mark.parametrize("asked", ["fp16", "bf16"])
def test_half_precision_asked_on_cpu_says_fp32_runs(tiny_model_dir, caplog, asked):
    import torch

    recorder = Recorder()
    settings = ServiceSettings(
        model_dir=str(tiny_model_dir), tokenizer_dir=str(tiny_model_dir), precision=asked, warmup=False
    )
    with caplog.at_level(logging.INFO, logger="chatfleet_runtime.service"):
        service = ChatService(settings, recorder)
    assert recorder.placements == [(asked, "fp32", "cpu")]
    assert next(service.model.parameters()).dtype == torch.float32
    assert f"serving precision fp32 on cpu (asked: {asked})" in caplog.text
    assert f"{asked} is not served on CPU; using fp32" in caplog.text


def test_bench_precision_row_compares_int8_with_fp32(tiny_model_dir):
    import importlib.util

    from chatfleet_platform.config import REPO_ROOT

    spec = importlib.util.spec_from_file_location("runtime_bench", REPO_ROOT / "bench" / "runtime_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.precision_rows(tiny_model_dir, 1, batch=2, max_tokens=4, reps=1)
    assert rows["int8"]["weights_mib"] < rows["fp32"]["weights_mib"]
    assert rows["int8"]["tokens_per_s"] > 0 and rows["int8_vs_fp32"]["memory_ratio"] < 0.6
    assert "int8 weights" in "\n".join(bench.precision_table(rows))
