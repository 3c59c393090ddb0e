"""The suite cannot lose tests silently: no skips, no import-or-skip, no conditional collection.

A missing real part (torch, pytriton, helm, promtool, checkov, go) is a failure that says how to get it
(tests/needs.py), and tests/conftest.py turns any skip that slips through into a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.harness

TESTS = Path(__file__).resolve().parents[1]
# spelled in parts so that a plain grep for these names finds only real uses
FORBIDDEN = re.compile(
    "|".join(["import" + "orskip", "collect" + "_ignore", r"pytest\.skip\b", r"\.mark\.skip", "skip" + "if"])
)


def test_no_skip_machinery_in_the_tests():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.resolve() == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FORBIDDEN.search(line):
                offenders.append(f"{path.relative_to(TESTS)}:{number}: {line.strip()}")
    assert offenders == [], "\n".join(offenders)


def test_a_skip_is_reported_as_a_failure(tmp_path):
    """A throwaway test that skips, under the suite's hook: it fails, and the message is kept."""
    (tmp_path / "conftest.py").write_text("from needs import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_case.py").write_text(
        "import pytest\n\n\ndef test_skips():\n    pytest.skip('some tool is missing')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_case.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout and "some tool is missing" in result.stdout, result.stdout
    assert "from needs import pytest_runtest_makereport" in (TESTS / "conftest.py").read_text()


def test_no_two_test_modules_share_a_basename():
    """pytest's default import mode cannot collect two test modules of one name: the whole run stops."""
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
