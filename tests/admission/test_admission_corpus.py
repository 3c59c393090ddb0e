"""Bad ChatbotService manifests are refused at admission with a message naming the field.

Test design: each file in cases/ is one bad manifest; its first line `# expect: ...` holds a substring
the API server's refusal must contain. Offline, the corpus is checked for shape (and CEL messages for
presence in the CRD); online, every case goes through `kubectl apply --dry-run=server`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
CASES = sorted((HERE / "cases").glob("*.yaml"))
CRD_TEXT = (HERE.parents[1] / "crds" / "chatfleet.io_chatbotservices.yaml").read_text()
FIELD = re.compile(r"(spec|metadata)(\.[A-Za-z]+|\[\d+\])+")


def expected(path: Path) -> str:
    """The expected message substring of one case."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: ...'"
    return first.removeprefix("# expect: ")


@pytest.mark.harness
def test_corpus_is_big_enough():
    assert len(CASES) >= 30


@pytest.mark.harness
@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_case_is_well_formed(case: Path):
    doc = yaml.safe_load(case.read_text())
    assert doc["kind"] == "ChatbotService" and doc["apiVersion"] == "chatfleet.io/v1alpha1"
    message = expected(case)
    assert FIELD.search(message) or message.startswith("spec:"), f"{case.name}: message must name a field"
    if " must " in message and "in body" not in message:  # a CEL rule of ours: its message is in the CRD
        assert message in CRD_TEXT


@pytest.mark.cluster
@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_refused_with_message(crd_installed, case: Path):
    result = crd_installed.kubectl("apply", "--dry-run=server", "-n", "default", "-f", str(case), check=False)
    assert result.returncode != 0, f"{case.name} was accepted"
    assert expected(case) in result.stderr + result.stdout


@pytest.mark.cluster
@pytest.mark.parametrize(
    "example", sorted((HERE.parents[1] / "examples").glob("*.yaml")), ids=lambda p: p.stem
)
def test_examples_are_accepted(crd_installed, example: Path):
    result = crd_installed.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-f", str(example), check=False
    )
    assert result.returncode == 0, result.stderr
