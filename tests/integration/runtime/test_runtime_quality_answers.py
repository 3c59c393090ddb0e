"""The quality gate's golden prompts on the real stack: the operator's client (analysis.answers.ask_all)
against real chat APIs over real tritonservers.

Test design: stable is the session's chat API over the tiny model (seed 0). Asking it the golden prompts
twice must give the same answers (greedy, fixed seed: what makes a release that changes nothing that can
change answers agree 100 %), and a chat API over a model of the same shape with other weights (seed 1:
"the wrong weights", fluent and 200 with good latency) must fail on answer agreement alone. The verdicts
come from the same assessor and checks the operator uses (quality.checks_of of a parsed spec).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from chatfleet_operator.analysis import quality
from chatfleet_operator.analysis.answers import ask_all
from chatfleet_operator.analysis.assess import FAILED, SUCCESSFUL, assess
from chatfleet_operator.spec import QualitySpec
from chatfleet_platform.localruntime.testing import ChatApiProcess, model_config
from chatfleet_platform.localruntime.tiny import build_tiny_model
from chatfleet_runtime.launcher.tritonhome import TritonServer, local_repository

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SPEC = QualitySpec.from_dict(
    {
        "enabled": True,
        "prompts": [
            {"name": "refund", "prompt": "How long do refunds take?"},
            {"name": "hello", "prompt": "Hello! Who are you?"},
            {"name": "order", "prompt": "Where is my order 1234?"},
        ],
        "maxTokens": 16,
    }
)
PROMPTS = SPEC.prompts


def ask(api) -> list[quality.Answer]:
    return ask_all(
        f"{api.url}/v1/chat/completions",
        "tiny-chat",
        PROMPTS,
        max_tokens=SPEC.max_tokens,
        seed=SPEC.seed,
        timeout_seconds=30,
        budget_seconds=120,
    )


@pytest.fixture(scope="module")
def other_weights(rt_workdir, make_api_env):
    """A chat API over a model of the tiny model's shape and tokenizer, with other weights (seed 1)."""
    base = rt_workdir / "other-weights"
    model_dir = build_tiny_model(base / "model", seed=1)
    repo = local_repository(base / "repo", model_config(model_dir, max_context_tokens=512, max_new_tokens=64))
    triton = TritonServer(repo, home=rt_workdir / "triton-home", log_path=base / "triton.log")
    api = None
    try:
        triton.start().wait_ready(180)
        api = ChatApiProcess(triton.grpc_url, make_api_env(None), log_path=base / "api.log").start()
        yield api
    finally:
        if api is not None:
            api.stop()
        triton.stop()


def test_the_same_model_answers_the_golden_prompts_identically(api, triton):
    first, second = ask(api), ask(api)
    assert all(a.text for a in first), first
    result = quality.score(PROMPTS, second, first)
    assert result.canary[quality.AGREEMENT] == 100.0, (first, second)
    m = assess(quality.to_sample(result, datetime.now(UTC), len(PROMPTS)), quality.checks_of(SPEC))
    assert m.verdict == SUCCESSFUL, m.message


def test_other_weights_fail_on_answer_agreement_alone(api, triton, other_weights):
    stable, canary = ask(api), ask(other_weights)
    assert all(a.text for a in canary) and all(a.text for a in stable), (canary, stable)
    result = quality.score(PROMPTS, canary, stable)
    m = assess(quality.to_sample(result, datetime.now(UTC), len(PROMPTS)), quality.checks_of(SPEC))
    assert m.verdict == FAILED and quality.AGREEMENT in m.failed_metrics, m.message
    # the same answers with agreement left out (a release meant to change answers) pass
    lenient = QualitySpec.from_dict({**_raw(), "compareWithStable": False})
    m = assess(quality.to_sample(result, datetime.now(UTC), len(PROMPTS)), quality.checks_of(lenient))
    assert quality.AGREEMENT not in m.failed_metrics, m.message


def _raw() -> dict:
    return {
        "enabled": True,
        "prompts": [{"name": p.name, "prompt": p.prompt} for p in PROMPTS],
        "maxTokens": SPEC.max_tokens,
    }
