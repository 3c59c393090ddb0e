"""Fixtures for the runtime's unit tests: the tiny model (built once per session) and its tokenizer."""

from __future__ import annotations

import pytest
from needs import need_module


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama + tokenizer built offline (chatfleet_platform.localruntime.tiny)."""
    need_module("torch", "run `make setup` (the runtime extra)")
    from chatfleet_platform.localruntime.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    """The tiny model's tokenizer, loaded the production way."""
    from chatfleet_runtime.engine.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def model(tiny_model_dir):
    """The tiny model on CPU, in fp32 (CHATFLEET_TEST_PRECISION=bf16 runs the engine's tests in bf16)."""
    import os

    from chatfleet_runtime.engine.loading import choose_placement, load_model

    precision = os.environ.get("CHATFLEET_TEST_PRECISION", "fp32")
    placement = choose_placement(precision, "KIND_CPU", cuda_available=False, cpu_bf16=precision == "bf16")
    return load_model(tiny_model_dir, placement)
