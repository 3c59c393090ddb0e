"""The runtime docs say what the code does: defaults quoted in the docs are read from the code, and the
OpenAI field-policy table names every field the chat API has a policy for.

Test design: each check parses the one sentence or table the docs hold and compares it with the value
the code (or the chart) actually uses, so a change on either side without the other fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from chatfleet_operator.builders import build_deployment
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef
from chatfleet_platform.common.config import REPO_ROOT
from chatfleet_runtime import prompting

DOCS = REPO_ROOT / "docs"


def test_worker_threads_in_the_docs_match_the_code_and_the_chart():
    code = subprocess.run(
        [
            sys.executable,
            "-c",
            "from chatfleet_operator.settings import RuntimeSettings as R; print(R().workers)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": ":".join(sys.path)},  # without CHATFLEET_WORKERS: the default
    ).stdout.strip()
    values = yaml.safe_load((REPO_ROOT / "charts" / "chatfleet-operator" / "values.yaml").read_text())
    documented = re.findall(r"CHATFLEET_WORKERS`\s*=\s*(\d+)", (DOCS / "operator.md").read_text())
    assert documented and set(documented) == {code} == {str(values["operator"]["workers"])}


def test_defaults_sentence_claims_history_only_with_redis():
    text = (DOCS / "api.md").read_text()
    assert "kept in the pod" not in text
    # and indeed: a spec without sessions.redis gives the chat API no Redis, hence no history
    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}})
    dep = build_deployment(ObjectRef("ns", "bot", "u", 1), spec, PodSettings(), revision="r")
    chat = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "chat-api")
    assert "CHATFLEET_REDIS_URL" not in {e["name"] for e in chat["env"]}
    assert "without it each turn stands alone" in text


def test_openai_policy_table_names_every_field_with_a_policy():
    text = (DOCS / "runtime.md").read_text()
    table = text.split("## OpenAI compatibility", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", table))
    fields = set(prompting.REFUSED_FIELDS) | set(prompting.HONOURED_FIELDS) | set(prompting.NO_OP_FIELDS)
    assert fields <= named, sorted(fields - named)
