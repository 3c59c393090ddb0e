"""hack/build-test-servers.sh trusts a tool's venv only where it was made.

pip writes each script's interpreter as an absolute path, so a venv whose cache folder was moved keeps its
`.complete` marker while none of its commands start (the checkov scan failed so, 255 from exec): such a
venv is made again, never called.
"""

import os
import subprocess
from pathlib import Path

import pytest
from chatfleet_platform.common.config import REPO_ROOT, read_versions

pytestmark = pytest.mark.harness

SCRIPT = REPO_ROOT / "hack" / "build-test-servers.sh"
VERSION = read_versions()["CHECKOV_VERSION"]


def made_venv(cache: Path, made_at: Path) -> Path:
    """A marked checkov venv in cache whose pip script names the interpreter of a venv at made_at."""
    venv = cache / "tools" / f"checkov-{VERSION}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "pip").write_text(f"#!{made_at}/bin/python3\nimport sys\n")
    (venv / ".complete").touch()
    return venv


def run(cache: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The script for checkov, with a python3 on PATH that fails (so nothing is installed for real)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'fake python3 called' >&2\nexit 7\n")
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "CHATFLEET_CACHE": str(cache), "PATH": f"{fake}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(SCRIPT), "checkov"], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_venv_where_it_was_made_is_cached(tmp_path):
    cache = tmp_path / "cache"
    venv = made_venv(cache, cache / "tools" / f"checkov-{VERSION}")
    res = run(cache, tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"checkov v{VERSION} cached" in res.stderr
    assert (venv / ".complete").exists()


def test_a_venv_moved_from_where_it_was_made_is_made_again(tmp_path):
    cache = tmp_path / "cache"
    made_venv(cache, tmp_path / "elsewhere" / "tools" / f"checkov-{VERSION}")
    res = run(cache, tmp_path)
    assert "made at another path" in res.stderr
    assert "installing checkov" in res.stderr
    assert "fake python3 called" in res.stderr  # it went on to make the venv (with the fake python3)
    assert res.returncode == 7
