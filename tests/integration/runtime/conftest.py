"""Fixtures for the runtime's integration tests: the tiny model, a real Redis, a real tritonserver and the
chat API, all on 127.0.0.1 free ports, shared per session and stopped by PID even on failure."""

from __future__ import annotations

import json

import pytest
from needs import need_module

# The runtime's real parts: a missing one fails every test here with how to install it (never a skip).
need_module("torch", "run `make setup` (the runtime package's dependencies)")
need_module("pytriton", "run `make setup` (the runtime package's dependencies: nvidia-pytriton)")

from chatfleet_platform.localruntime.testing import ChatApiProcess, model_config, tiny_model  # noqa: E402 - after the checks above
from chatfleet_platform.servers.services import Redis  # noqa: E402 - after the checks above
from chatfleet_runtime.launcher.tritonhome import TritonServer, local_repository  # noqa: E402 - after the checks above

FAQ = json.dumps([{"keywords": ["refund", "money"], "answer": "Refunds take 5 days (FAQ)."}])
FALLBACK = "The assistant is unavailable; this is the fallback text."


@pytest.fixture(scope="session")
def rt_workdir(tmp_path_factory):
    """Scratch folder shared by the runtime integration tests."""
    return tmp_path_factory.mktemp("runtime-it")


@pytest.fixture(scope="session")
def tiny_model_dir(rt_workdir):
    """The tiny random Llama + tokenizer, built offline."""
    return tiny_model(rt_workdir)


@pytest.fixture(scope="session")
def triton_repo(rt_workdir, tiny_model_dir):
    """The model repository (one decoupled model, chat) rendered by the shared config generator."""
    return local_repository(
        rt_workdir / "repo", model_config(tiny_model_dir, max_context_tokens=512, max_new_tokens=64)
    )


@pytest.fixture(scope="session")
def triton(rt_workdir, triton_repo):
    """Replica A's tritonserver (real binary from the pytriton wheel)."""
    server = TritonServer(triton_repo, home=rt_workdir / "triton-home", log_path=rt_workdir / "triton-a.log")
    try:
        server.start().wait_ready(180)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_srv(rt_workdir):
    """A real redis-server."""
    server = Redis(rt_workdir / "redis")
    try:
        yield server.start()
    finally:
        server.stop()


def api_env(redis_url: str | None, **extra: str) -> dict[str, str]:
    """Environment for a chat API process in tests (short deadline and breaker reset)."""
    env = {
        "CHATFLEET_MODEL_NAME": "tiny-chat",
        "CHATFLEET_REQUEST_TIMEOUT_SECONDS": "20",
        "CHATFLEET_BREAKER_FAILURES": "2",
        "CHATFLEET_BREAKER_RESET_SECONDS": "1",
        "CHATFLEET_FALLBACK_TEXT": FALLBACK,
        "CHATFLEET_FAQ": FAQ,
        "CHATFLEET_HISTORY_TURNS": "5",
    }
    if redis_url:
        env["CHATFLEET_REDIS_URL"] = redis_url
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def make_api_env():
    """The api_env helper, for test modules that start their own chat API."""
    return api_env


@pytest.fixture(scope="session")
def api(rt_workdir, triton, redis_srv):
    """Replica A's chat API (Triton A + the shared Redis)."""
    proc = ChatApiProcess(triton.grpc_url, api_env(redis_srv.url), log_path=rt_workdir / "api-a.log")
    try:
        yield proc.start()
    finally:
        proc.stop()
