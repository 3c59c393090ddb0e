"""hack/venv-cache.sh, which `make venv` runs: a fresh clone's venv made from the one kept for its pins.

Test design: small real venvs (`python -m venv --without-pip`, one console script written as pip writes
them, one editable install of the clone's package written as setuptools writes it) in scratch clones, kept
and restored by the real script into a scratch cache. What must hold: the restored venv runs as itself (its
scripts' interpreter is its own, not the kept copy's) and imports its own clone's package, it shares the
kept copy's files instead of copying them, the kept copy is left as it was, a restored venv carries no
install stamp, a clone without the kept venv's packages gets no venv (make installs one), a change of pins
is another key, and only the two newest keys stay.
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
    """The script as make runs it: in the clone's root (the venv's parent here)."""
    env = {**os.environ, "CHATFLEET_CACHE": str(cache), "VENV_PYTHON": sys.executable}
    venv.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        ["bash", str(SCRIPT), action, str(venv), *map(str, pyprojects)],
        capture_output=True,
        text=True,
        env=env,
        cwd=venv.parent,
        timeout=60,
    )


def site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python*/site-packages")
    return site


def clone(root: Path) -> Path:
    """A clone's root with the source folder of the package `hello` (as `pip install -e ./hello` needs)."""
    (root / "hello" / "hello").mkdir(parents=True)
    (root / "hello" / "hello" / "__init__.py").write_text("")
    return root


def make_venv(path: Path) -> Path:
    """A venv in a clone's root with one console script, one library file, the editable install of the
    clone's package `hello` as setuptools writes it (a finder module named by a .pth file), and the stamp
    `make venv` writes."""
    root = clone(path.parent)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    script = path / "bin" / "hello"
    script.write_text(f"#!{path}/bin/python\nimport sys, hello\nprint(sys.prefix, hello.__file__)\n")
    script.chmod(0o755)
    (path / "lib" / "weights.bin").write_bytes(b"\0" * 4096)
    site = site_packages(path)
    (site / "__editable___hello_0_1_0_finder.py").write_text(
        "import sys\n"
        "from importlib.util import spec_from_file_location\n"
        f"MAPPING: dict[str, str] = {{'hello': '{root}/hello/hello'}}\n"
        "class Finder:\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        if name in MAPPING:\n"
        "            return spec_from_file_location(name, MAPPING[name] + '/__init__.py')\n"
        "def install():\n"
        "    sys.meta_path.append(Finder)\n"
    )
    (site / "__editable__.hello-0.1.0.pth").write_text(
        "import __editable___hello_0_1_0_finder; __editable___hello_0_1_0_finder.install()\n"
    )
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

    second = clone(tmp_path / "clone-2") / ".venv"
    restored = venv_cache("restore", second, pyproject, cache=cache)
    assert restored.returncode == 0, restored.stderr

    # its own interpreter, and the package of its own clone
    out = subprocess.run([str(second / "bin" / "hello")], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(second), str(second.parent / "hello" / "hello" / "__init__.py")]
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
    assert out.split() == [str(first), str(first.parent / "hello" / "hello" / "__init__.py")]
    assert list(first.glob(".installed-*"))


def test_a_clone_without_the_packages_the_kept_venv_installs_gets_no_venv_and_drops_it(tmp_path, pyproject):
    cache = tmp_path / "cache"
    assert (
        venv_cache("save", make_venv(tmp_path / "clone-1" / ".venv"), pyproject, cache=cache).returncode == 0
    )
    bare = tmp_path / "clone-2" / ".venv"  # a clone with no hello/ folder
    res = venv_cache("restore", bare, pyproject, cache=cache)
    assert res.returncode == 1, res.stderr
    assert "hello" in res.stderr
    assert not bare.exists()
    assert not [d for d in (cache / "venvs").iterdir() if d.is_dir()]  # the next save keeps one that fits


def test_nothing_kept_or_other_pins_is_no_restore(tmp_path, pyproject):
    cache = tmp_path / "cache"
    target = clone(tmp_path / "clone") / ".venv"
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
        venv_cache("restore", clone(tmp_path / f"r{n}") / ".venv", p, cache=cache).returncode == 0
        for n, p in enumerate(keys)
    ]
    assert restorable == [False, True, True]
