"""hack/build-platform.sh fails with one clear message naming what is missing."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from chatfleet_platform.common.config import BUILD_SCRIPT

pytestmark = pytest.mark.harness


def run(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), "etcd"], env=env, capture_output=True, text=True, timeout=120
    )


def path_without_go(tmp_path) -> str:
    """A PATH with every command of /usr/bin and /bin but go (so the test runs wherever go is installed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in (Path("/usr/bin"), Path("/bin")):
        for exe in folder.iterdir():
            if exe.name not in ("go", "gofmt") and not (bin_dir / exe.name).exists():
                (bin_dir / exe.name).symlink_to(exe)
    return str(bin_dir)


def test_missing_go_toolchain_is_named(tmp_path):
    env = {**os.environ, "PATH": path_without_go(tmp_path), "CHATFLEET_CACHE": str(tmp_path)}
    assert shutil.which("go", path=env["PATH"]) is None
    res = run(env)
    assert res.returncode == 1
    assert "the Go toolchain is missing" in res.stderr


def test_unreachable_module_proxy_is_named(tmp_path):
    env = {
        **os.environ,
        "CHATFLEET_CACHE": str(tmp_path / "cache"),
        "GOMODCACHE": str(tmp_path / "mod"),
        "GOPROXY": "http://127.0.0.1:9",
    }
    res = run(env)
    subprocess.run(["chmod", "-R", "u+w", str(tmp_path)], check=False)
    assert res.returncode == 1
    assert "cannot reach the Go module proxy (http://127.0.0.1:9)" in res.stderr
    assert res.stderr.count("error:") == 1


def test_cached_binaries_build_nothing(tmp_path):
    cache = tmp_path / "cache"
    for name, version in (("etcd", "3.6.10"),):
        d = cache / "bin" / f"{name}-{version}"
        d.mkdir(parents=True)
        (d / name).write_text("#!/bin/sh\n")
        (d / name).chmod(0o755)
    res = run({**os.environ, "CHATFLEET_CACHE": str(cache), "GOPROXY": "off"})
    assert res.returncode == 0, res.stderr
    assert "all cached" in res.stderr
