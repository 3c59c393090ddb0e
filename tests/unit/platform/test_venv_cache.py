"""hack/venv-cache.sh, which `make venv` runs: a fresh clone's venv made from the one kept for its pins.

Test design: small real venvs (`python -m venv --without-pip`, one console script written as pip writes
them) in a scratch folder, kept and restored by the real script into a scratch cache. What must hold: the
restored venv runs as itself (its scripts' interpreter is its own, not the kept copy's), it shares the kept
copy's files instead of copying them, the kept copy is left as it was, a restored venv carries no install
stamp, a change of pins is another key, and only the two newest keys stay.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from chatfleet_platform.common.config import REPO_ROOT

pytestmark = pytest.mark.harness

SCRIPT = REPO_ROOT / "hack" / "venv-cache.sh"


def venv_cache(action: str, venv: Path, *pyprojects: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CHATFLEET_CACHE": str(cache), "VENV_PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), action, str(venv), *map(str, pyprojects)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def make_venv(path: Path) -> Path:
    """A venv with one console script and one library file, and the stamp `make venv` writes."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    script = path / "bin" / "hello"
    script.write_text(f"#!{path}/bin/python\nimport sys\nprint(sys.prefix)\n")
    script.chmod(0o755)
    (path / "lib" / "weights.bin").write_bytes(b"\0" * 4096)
    (path / ".installed-0123456789ab").touch()
    return path


@pytest.fixture
def pyproject(tmp_path: Path) -> Path:
    p = tmp_path / "pyproject.toml"
    p.write_text('[project]\nname = "x"\ndependencies = ["a==1"]\n')
    return p


def test_a_restored_venv_runs_as_itself_and_shares_the_kept_files(tmp_path, pyproject):
    cache = tmp_path / "cache"
    first = make_venv(tmp_path / "clone-1" / ".venv")
    saved = venv_cache("save", first, pyproject, cache=cache)
    assert saved.returncode == 0, saved.stderr

    second = tmp_path / "clone-2" / ".venv"
    second.parent.mkdir()
    restored = venv_cache("restore", second, pyproject, cache=cache)
    assert restored.returncode == 0, restored.stderr

    out = subprocess.run([str(second / "bin" / "hello")], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(second)
    assert (second / "bin" / "hello").read_text().startswith(f"#!{second}/bin/python\n")
    assert str(second) in (second / "pyvenv.cfg").read_text()
    # the same file on disk, not a copy
    assert (second / "lib" / "weights.bin").stat().st_ino == (first / "lib" / "weights.bin").stat().st_ino
    # no stamp until make's install has run in this clone
    assert not list(second.glob(".installed-*"))
    # the kept copy (and the venv it came from) unchanged: still its own interpreter, still stamped
    (kept,) = [d for d in (cache / "venvs").iterdir() if d.is_dir()]
    assert (kept / "bin" / "hello").read_text().startswith(f"#!{first}/bin/python\n")
    assert (first / "bin" / "hello").read_text().startswith(f"#!{first}/bin/python\n")
    out = subprocess.run([str(first / "bin" / "hello")], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(first)
    assert list(first.glob(".installed-*"))


def test_nothing_kept_or_other_pins_is_no_restore(tmp_path, pyproject):
    cache = tmp_path / "cache"
    target = tmp_path / "clone" / ".venv"
    none = venv_cache("restore", target, pyproject, cache=cache)
    assert none.returncode == 1, none.stderr
    assert not target.exists()

    assert venv_cache("save", make_venv(tmp_path / "a" / ".venv"), pyproject, cache=cache).returncode == 0
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["a==2"]\n')
    other = venv_cache("restore", target, pyproject, cache=cache)
    assert other.returncode == 1, other.stderr
    assert not target.exists()


def test_restore_never_touches_an_existing_venv(tmp_path, pyproject):
    cache = tmp_path / "cache"
    assert venv_cache("save", make_venv(tmp_path / "a" / ".venv"), pyproject, cache=cache).returncode == 0
    existing = make_venv(tmp_path / "b" / ".venv")
    before = (existing / "bin" / "hello").read_text()
    res = venv_cache("restore", existing, pyproject, cache=cache)
    assert res.returncode == 2
    assert "exists" in res.stderr
    assert (existing / "bin" / "hello").read_text() == before


def test_the_two_newest_keys_stay(tmp_path):
    cache = tmp_path / "cache"
    keys = []
    for n in range(3):
        p = tmp_path / f"pyproject-{n}.toml"
        p.write_text(f'[project]\nname = "x"\ndependencies = ["a=={n}"]\n')
        assert venv_cache("save", make_venv(tmp_path / f"v{n}" / ".venv"), p, cache=cache).returncode == 0
        keys.append(p)
    restorable = [
        venv_cache("restore", tmp_path / f"r{n}" / ".venv", p, cache=cache).returncode == 0
        for n, p in enumerate(keys)
    ]
    assert restorable == [False, True, True]
