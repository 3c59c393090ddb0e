"""The KV budget through tritonserver and the chat API: resolved at load, exported, and a full budget is 429.

Test design: the session's Triton (no KV parameters: the default share of this machine's memory) must
export a budget and rows capped by its max_batch_size (32) and log the sizing; a second Triton whose KV
memory (kv_memory_bytes) fits one typical row, with no admission queue, must answer concurrent chats
with one running at a time and the others refused as HTTP 429 + Retry-After by the chat API, the
admitted ones completing.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
from chatfleet_platform.localruntime.testing import ChatApiProcess, metric_value, model_config
from chatfleet_runtime.launcher.tritonhome import TritonServer, local_repository

PREFIX = 2**20


def test_the_default_budget_is_resolved_at_load_exported_and_logged(triton):
    budget = metric_value(triton.metrics_url, "chatfleet_model_kv_budget_bytes", model="chat")
    rows = metric_value(triton.metrics_url, "chatfleet_model_kv_budget_rows", model="chat")
    prefix = metric_value(triton.metrics_url, "chatfleet_model_prefix_cache_capacity_bytes", model="chat")
    assert budget > 0 and prefix > 0, (budget, prefix)
    assert rows == 32  # this machine's memory fits far more tiny-model rows: max_batch_size caps them
    assert "kv cache: KV memory" in triton.log_tail(400)


def _per_position(model_dir) -> int:
    """KV bytes per position of the tiny model in fp32 (2 x layers x KV heads x head dim x 4)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * 4


def test_a_full_budget_answers_429_with_retry_after_and_the_admitted_complete(
    rt_workdir, tiny_model_dir, make_api_env
):
    typical, tokens = 64, 48
    params = {
        "kv_memory_bytes": str((typical + tokens) * _per_position(tiny_model_dir) + PREFIX),  # one row
        "prefix_cache_bytes": str(PREFIX),
        "kv_typical_prompt_tokens": str(typical),
        "admission_queue": "0",
        "admission_wait_ms": "0",
    }
    base = rt_workdir / "kv-budget"
    repo = local_repository(
        base / "repo",
        model_config(tiny_model_dir, max_context_tokens=512, max_new_tokens=tokens, extra_parameters=params),
    )
    server = TritonServer(repo, home=base / "triton-home", log_path=base / "triton.log")
    api = None
    try:
        server.start().wait_ready(180)
        assert metric_value(server.metrics_url, "chatfleet_model_kv_budget_rows", model="chat") == 1
        api = ChatApiProcess(server.grpc_url, make_api_env(None), log_path=base / "api.log").start()
        body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": tokens}

        def chat(i: int) -> httpx.Response:
            return httpx.post(f"{api.url}/v1/chat/completions", json={**body, "seed": i}, timeout=60)

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(chat, range(6)))
    finally:
        if api is not None:
            api.stop()
        server.stop()
    codes = sorted(r.status_code for r in answers)
    assert 200 in codes and 429 in codes and set(codes) == {200, 429}, codes
    for r in answers:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "overloaded"
            assert "kv budget" in r.json()["error"]["message"]
        else:
            assert r.json()["chatfleet"]["fallback"] is False  # the model answered, in full
            assert r.json()["usage"]["completion_tokens"] > 0
