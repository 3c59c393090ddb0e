"""hack/test-layers.sh, which `make test` runs: lanes side by side, and a failing layer stops the run.

Test design: small layers of throwaway tests in a scratch folder, run by the real script with this venv's
pytest. Side by side is shown without timing: each lane's test waits for a file the other lane's writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from chatfleet_platform.common.config import REPO_ROOT

pytestmark = pytest.mark.harness

SCRIPT = REPO_ROOT / "hack" / "test-layers.sh"


def layer(root: Path, name: str, body: str) -> None:
    d = root / "tests" / name
    d.mkdir(parents=True)
    (d / f"test_{name}.py").write_text(body)


def run(root: Path, *stages: str, sigint: object = signal.SIG_DFL) -> subprocess.CompletedProcess:
    """The script on the stages, started with SIGINT's disposition `sigint` (SIG_IGN: as a background job
    of a shell without job control starts it)."""
    pytest_cmd = root / "pytest"
    pytest_cmd.write_text(f'#!/bin/sh\nexec {sys.executable} -m pytest -p no:cacheprovider "$@"\n')
    pytest_cmd.chmod(0o755)
    return subprocess.run(
        ["bash", str(SCRIPT), str(pytest_cmd), *stages],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )


def wait_for(name: str) -> str:
    """A test body that writes its own file, then waits (30 s at most) for the other lane's."""
    return f"""
import pathlib, time
def test_meet():
    pathlib.Path("{name}.mine").touch()
    other = "{"b" if name == "a" else "a"}.mine"
    deadline = time.monotonic() + 30
    while not pathlib.Path(other).exists():
        assert time.monotonic() < deadline, "the other lane never ran beside this one"
        time.sleep(0.1)
"""


def test_lanes_run_side_by_side_and_the_table_counts_every_layer(tmp_path):
    layer(tmp_path, "first", "def test_ok():\n    pass\n")
    layer(tmp_path, "a", wait_for("a"))
    layer(tmp_path, "b", wait_for("b"))
    res = run(tmp_path, "tests/first", "tests/a | tests/b")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1] == "3 passed, 0 failed"
    table = [ln for ln in lines if ln.startswith("[layers]   ")]
    assert [ln.split()[1] for ln in table] == ["first", "a", "b"]
    assert "----- a: pytest's output -----" in res.stdout  # each layer's output printed whole


@pytest.mark.parametrize(
    "sigint",
    [
        pytest.param(signal.SIG_DFL, id="started-normally"),
        pytest.param(signal.SIG_IGN, id="started-with-sigint-ignored"),
    ],
)
def test_a_failing_layer_stops_its_lane_and_interrupts_the_other_whose_fixtures_tear_down(tmp_path, sigint):
    layer(tmp_path, "cheap", "def test_ok():\n    pass\n")
    layer(
        tmp_path, "bad", "import pathlib, time\ndef test_bad():\n    time.sleep(1)\n    assert False, 'bad'\n"
    )
    layer(tmp_path, "after", "def test_never():\n    pass\n")
    layer(
        tmp_path,
        "long",
        """
import pathlib, time, pytest
@pytest.fixture
def resource():
    pathlib.Path("long.started").touch()
    yield
    pathlib.Path("long.torn-down").touch()
def test_long(resource):
    time.sleep(600)
""",
    )
    res = run(tmp_path, "tests/cheap tests/bad tests/after | tests/long", sigint=sigint)
    out = res.stdout
    assert res.returncode != 0, out
    assert "[layers] bad failed (pytest exit 1): the layers after it do not run" in out
    assert "[layers]   after        did not run" in out
    assert "[layers] long: 0 passed, 0 failed" in out and "(interrupted)" in out
    assert (tmp_path / "long.torn-down").exists(), "the interrupted layer's fixtures did not tear down"
    assert out.splitlines()[-1] == "1 passed, 1 failed"


def test_the_last_lane_of_a_stage_keeps_its_priority_and_the_others_run_niced(tmp_path):
    body = "import os, pathlib\ndef test_nice():\n    pathlib.Path('{}.nice').write_text(str(os.nice(0)))\n"
    layer(tmp_path, "first", body.format("first"))
    layer(tmp_path, "other", body.format("other"))
    layer(tmp_path, "longest", body.format("longest"))
    res = run(tmp_path, "tests/first", "tests/other | tests/longest")
    assert res.returncode == 0, res.stdout + res.stderr
    base = os.nice(0)
    niceness = {n: int((tmp_path / f"{n}.nice").read_text()) for n in ("first", "other", "longest")}
    assert niceness == {"first": base, "other": min(base + 10, 19), "longest": base}, res.stdout
    assert "[layers] other: starting (beside the other lanes of this stage), at nice 10" in res.stdout
