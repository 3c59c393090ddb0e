"""`kubectl chatbot` for krew: plugins/chatbot.yaml and the archive `hack/release.sh plugin-archive` builds.

Test design: the linux/amd64 archive is built for real (PyInstaller in a clean venv, about a minute) once
per key, a hash of the modules the executable holds, the packages' pyproject.toml files, the release
script and the pinned versions, and kept under
<cache>/plugin/<key>/; a failed build fails the test (never a skip). `hack/release.sh krew-manifest` fills
the template with that archive's sha256 and stand-in checksums for the three platforms built elsewhere.
The filled manifest is checked three ways: its structure here (what krew requires, one platform per
supported os/arch, the sha256 the archive's, `bin` in the archive and executable), krew's own
validate-krew-manifest, and `kubectl krew install --manifest --archive` into an empty KREW_ROOT, after which
`kubectl chatbot --help` runs through kubectl's plugin lookup. The unpacked executable runs with nothing on
PATH (no Python, no venv): --help, and `status` with no cluster is one line of error and exit 1.
"""

from __future__ import annotations

import fcntl
import hashlib
import modulefinder
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from chatfleet_platform.common.config import REPO_ROOT, binaries, cache_dir, read_versions
from needs import need_executable
from test_release_pipeline import release as run_release
from test_release_pipeline import tagged, tree_copy

TEMPLATE = REPO_ROOT / "plugins" / "chatbot.yaml"
SCRIPT = REPO_ROOT / "hack" / "release.sh"
RELEASES = "https://github.com/chatfleet/chatfleet/releases/download"
#: krew's os/arch pairs this project builds, as the archives name them
PLATFORMS = ("linux_amd64", "linux_arm64", "darwin_amd64", "darwin_arm64")
#: what the archive for the platform built here (and on CI's ubuntu-22.04 runner) is
HERE = "linux_amd64"
#: the packages the executable is built from: it holds the modules of theirs that its entry point imports
PACKAGES = ("chatfleet_operator", "chatfleet_contract")
ENTRY = "chatfleet_operator.plugin"
#: what else the archive is made of: how those packages install (pins, version), the script, LICENSE
SOURCES = ("contract/pyproject.toml", "operator/pyproject.toml", "hack/release.sh", "LICENSE")


class _PackageImports(modulefinder.ModuleFinder):
    """The standard library's import finder, following only PACKAGES' modules."""

    def import_hook(self, name, caller=None, fromlist=None, level=-1):
        if level <= 0 and name.partition(".")[0] not in PACKAGES:
            raise ImportError(f"not followed: {name}")
        return super().import_hook(name, caller, fromlist, level)


def executable_modules() -> list[Path]:
    """The source files of PACKAGES that the executable holds: ENTRY and every module it imports, found as
    PyInstaller finds them (reading the import statements, those inside functions too, not running them)."""
    finder = _PackageImports(path=[str(REPO_ROOT / "operator"), str(REPO_ROOT / "contract")])
    finder.import_hook(ENTRY)
    return sorted(Path(m.__file__) for m in finder.modules.values() if m.__file__)


def version() -> str:
    return tomllib.loads((REPO_ROOT / "operator" / "pyproject.toml").read_text())["project"]["version"]


def archive_name(platform_: str) -> str:
    return f"kubectl-chatbot_{version()}_{platform_}.tar.gz"


def build_key() -> str:
    """A hash of what the executable holds (executable_modules()), how it is installed and packed, the pinned
    build tools and this machine: an operator change the executable does not import is no new archive."""
    digest = hashlib.sha256()
    versions = read_versions()
    for name in ("PYINSTALLER_VERSION", "PYINSTALLER_HOOKS_CONTRIB_VERSION"):
        digest.update(f"{name}={versions[name]}\n".encode())
    digest.update(f"{platform.machine()} {platform.libc_ver()}\n".encode())
    for f in [REPO_ROOT / source for source in SOURCES] + executable_modules():
        digest.update(f"{f.relative_to(REPO_ROOT)}\n".encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def release(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    """A dry run of hack/release.sh's `args` on this tree (the plugin's build takes about a minute)."""
    return run_release(REPO_ROOT, "--dry-run", "--out", str(out), *args, timeout=900)


@pytest.fixture(scope="session")
def archive() -> Path:
    """The linux/amd64 archive (and its .sha256 beside it), built once per build_key()."""
    if f"{platform.system().lower()}_{platform.machine()}" not in ("linux_x86_64", "linux_amd64"):
        pytest.fail(f"the krew test builds the {HERE} archive: run it on {HERE}, not {platform.machine()}")
    root = cache_dir() / "plugin"
    root.mkdir(parents=True, exist_ok=True)
    key = build_key()
    done = root / key / archive_name(HERE)
    # one build at a time (xdist workers, other checkouts): the second finds the first's archive
    with (root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            work = root / f"{key}.tmp"
            shutil.rmtree(work, ignore_errors=True)
            proc = release("plugin-archive", out=work)
            if proc.returncode != 0:
                pytest.fail(
                    f"hack/release.sh plugin-archive could not build the {HERE} archive "
                    f"(exit {proc.returncode}):\n{proc.stderr[-4000:]}",
                    pytrace=False,
                )
            shutil.rmtree(root / key, ignore_errors=True)
            work.rename(root / key)
    return done


@pytest.fixture(scope="session")
def manifest(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """plugins/chatbot.yaml filled by `hack/release.sh krew-manifest`: the archive's sha256, and stand-ins
    (one distinct value each) for the platforms built on other runners."""
    out = tmp_path_factory.mktemp("krew")
    shutil.copy2(f"{archive}.sha256", out)
    for i, p in enumerate(PLATFORMS):
        if p != HERE:
            (out / f"{archive_name(p)}.sha256").write_text(f"{str(i) * 64}  {archive_name(p)}\n")
    proc = release("krew-manifest", out=out)
    assert proc.returncode == 0, proc.stderr
    assert f"would run: gh release upload v{version()} {out / 'chatbot.yaml'} --clobber" in proc.stdout
    return out / "chatbot.yaml"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "kubectl-chatbot"


def krew_tool(name: str) -> str:
    v = read_versions()["KREW_VERSION"]
    path = cache_dir() / "bin" / f"krew-{v}" / name
    return need_executable(name, "run `make chart-tools` (or bash hack/build-platform.sh krew)", path=path)


# --- the archive ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_archive_holds_the_executable_and_the_license(archive: Path) -> None:
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"kubectl-chatbot", "LICENSE"}, sorted(members)
    assert all(m.isfile() for m in members.values())
    assert members["kubectl-chatbot"].mode & 0o111 == 0o111, oct(members["kubectl-chatbot"].mode)
    assert Path(f"{archive}.sha256").read_text() == f"{sha256(archive)}  {archive.name}\n"
    size = archive.stat().st_size
    assert 5 << 20 < size < 80 << 20, f"{archive.name}: {size} bytes"


@pytest.mark.slow
def test_the_executable_runs_with_nothing_on_path(archive: Path, tmp_path: Path) -> None:
    """No Python, no venv: PATH is an empty folder. --help works; `status` with no cluster says so in a line."""
    exe = unpack(archive, tmp_path / "unpacked")
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"HOME": str(tmp_path / "home"), "PATH": str(empty), "TMPDIR": str(tmp_path)}

    def chatbot(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(exe), *args], env={**env, **extra}, capture_output=True, text=True, timeout=60, check=False
        )

    proc = chatbot("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: kubectl chatbot") and "promote" in proc.stdout

    # no kubeconfig at all
    proc = chatbot("status", "support-bot", KUBECONFIG=str(tmp_path / "none"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: no cluster configured") and proc.stderr.count("\n") == 1, (
        proc.stderr
    )
    # a kubeconfig whose API server does not answer
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    proc = chatbot("status", "support-bot", KUBECONFIG=str(config))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: no answer from https://127.0.0.1:1: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_the_archives_key_covers_every_module_the_executable_imports() -> None:
    """The kept archive is reused while its key holds: a module the executable imports but the key missed
    would ship stale. Every module of PACKAGES that importing the entry point loads is in the key, and the
    operator's kopf side (which the executable never imports) is not, so changing it builds nothing."""
    code = (
        "import sys, chatfleet_operator.plugin\n"
        f"print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.partition('.')[0] in {PACKAGES!r}))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    keyed = set(executable_modules())
    missing = {Path(f) for f in loaded.split()} - keyed
    assert not missing, (
        f"imported by the executable but not in the archive's key: {sorted(map(str, missing))}"
    )
    operator = REPO_ROOT / "operator" / "chatfleet_operator"
    assert operator / "plugin.py" in keyed
    assert not {operator / "main.py", operator / "kopflean.py", operator / "kopfext.py"} & keyed


# --- the manifest --------------------------------------------------------------------------------------------


def test_the_template_names_every_platform_the_release_builds() -> None:
    # the manifest itself, without the opening comment that says how it is filled
    text = "".join(line for line in TEMPLATE.read_text().splitlines(True) if not line.startswith("#"))
    assert set(re.findall(r"\{\{SHA256 (\w+)\}\}", text)) == set(PLATFORMS)
    script = SCRIPT.read_text()
    assert f"PLUGIN_PLATFORMS=({' '.join(PLATFORMS)})" in script
    assert set(re.findall(r"\{\{(\w+)", text)) == {"TAG", "VERSION", "SHA256"}


@pytest.mark.slow
def test_the_filled_manifest_is_a_krew_plugin(manifest: Path, archive: Path) -> None:
    doc = yaml.safe_load(manifest.read_text())
    assert doc["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert doc["kind"] == "Plugin"
    assert doc["metadata"]["name"] == "chatbot" == manifest.stem == TEMPLATE.stem
    spec = doc["spec"]
    assert spec["version"] == f"v{version()}"
    assert re.fullmatch(r"v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", spec["version"])
    assert spec["shortDescription"] and "\n" not in spec["shortDescription"]
    assert spec["description"] and spec["homepage"].startswith("https://")
    seen = []
    for pl in spec["platforms"]:
        labels = pl["selector"]["matchLabels"]
        assert set(pl["selector"]) == {"matchLabels"} and set(labels) == {"os", "arch"}, pl["selector"]
        name = f"{labels['os']}_{labels['arch']}"
        seen.append(name)
        assert pl["uri"] == f"{RELEASES}/v{version()}/{archive_name(name)}"
        assert re.fullmatch(r"[0-9a-f]{64}", pl["sha256"]), pl["sha256"]
        assert pl["bin"] == "kubectl-chatbot"
        assert pl["files"] == [{"from": "kubectl-chatbot", "to": "."}, {"from": "LICENSE", "to": "."}]
        if name == HERE:
            assert pl["sha256"] == sha256(archive)
        else:
            assert pl["sha256"] == str(PLATFORMS.index(name)) * 64
    assert sorted(seen) == sorted(PLATFORMS), seen
    with tarfile.open(archive) as tar:
        assert tar.getmember("kubectl-chatbot").mode & 0o111, "bin must be executable"


@pytest.mark.slow
def test_krews_validator_accepts_the_manifest_and_refuses_a_broken_one(
    manifest: Path, tmp_path: Path
) -> None:
    validate = krew_tool("validate-krew-manifest")

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        # -skip-install: its install pass downloads each uri (krew install --archive below does it for real)
        return subprocess.run(
            [validate, "-skip-install", "-manifest", str(path)], capture_output=True, text=True, timeout=60
        )

    proc = run(manifest)
    assert proc.returncode == 0, proc.stderr
    assert "structural validation OK" in proc.stderr and "no overlapping" in proc.stderr, proc.stderr

    broken = tmp_path / "chatbot.yaml"
    broken.write_text(
        re.sub(r'sha256: "[0-9a-f]{64}"', 'sha256: "not-a-checksum"', manifest.read_text(), count=1)
    )
    proc = run(broken)
    assert proc.returncode != 0 and "sha256" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_krew_installs_the_archive_and_kubectl_finds_the_plugin(
    manifest: Path, archive: Path, tmp_path: Path
) -> None:
    """`kubectl krew install --manifest --archive` into an empty KREW_ROOT, then `kubectl chatbot --help`."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "kubectl-krew").symlink_to(krew_tool("kubectl-krew"))
    kubectl = need_executable("kubectl", "run `make platform-build`", path=binaries().kubectl)
    (tools / "kubectl").symlink_to(kubectl)
    root = tmp_path / "krew"
    env = {
        "HOME": str(tmp_path / "home"),
        "KREW_ROOT": str(root),
        "KREW_NO_UPGRADE_CHECK": "1",
        "PATH": f"{root / 'bin'}{os.pathsep}{tools}",
        "TMPDIR": str(tmp_path),
    }

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        """kubectl with only the test's KREW_ROOT and PATH (its plugin lookup finds krew's links there)."""
        return subprocess.run(["kubectl", *args], env=env, executable=str(tools / "kubectl"),
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    proc = kubectl("krew", "install", f"--manifest={manifest}", f"--archive={archive}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Installed plugin: chatbot" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    installed = root / "store" / "chatbot" / f"v{version()}"
    assert (installed / "LICENSE").exists()
    assert stat.S_IMODE((installed / "kubectl-chatbot").stat().st_mode) & 0o111
    proc = kubectl("chatbot", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: kubectl chatbot"), proc.stdout


# --- the publishing path, with a stand-in for gh --------------------------------------------------------------


def fake_gh(folder: Path) -> Path:
    """gh that logs its arguments to <folder>/calls, knows no release, and downloads a .sha256 of '<i>'*64 for
    each platform i (as `gh release download --pattern --dir` would)."""
    folder.mkdir()
    names = " ".join(f"{i}:{archive_name(p)}" for i, p in enumerate(PLATFORMS))
    (folder / "gh").write_text(
        "#!/usr/bin/env bash\n"
        'echo "gh $*" >> "$(dirname "$0")/calls"\n'
        '[ "$1 $2" = "release view" ] && exit 1\n'
        'if [ "$1 $2" = "release download" ]; then\n'
        '  while [ $# -gt 0 ]; do [ "$1" = --dir ] && dir=$2; shift; done\n'
        f"  for entry in {names}; do\n"
        "    i=${entry%%:*} name=${entry#*:}\n"
        '    printf "%s  %s\\n" "$(printf "$i%.0s" $(seq 64))" "$name" > "$dir/$name.sha256"\n'
        "  done\n"
        "fi\n"
    )
    (folder / "gh").chmod(0o755)
    return folder


@pytest.mark.slow
def test_a_release_creates_the_draft_and_uploads_the_manifest(tmp_path: Path) -> None:
    """On a tagged copy of the tree: github-release creates the draft; krew-manifest downloads each archive's
    checksum from it, fills the template and uploads chatbot.yaml (plugin-archive's build is the fixture's)."""
    tag = f"v{version()}"
    root = tree_copy(tmp_path)
    shutil.copytree(REPO_ROOT / "plugins", root / "plugins")
    tagged(root, tag)
    tools = fake_gh(tmp_path / "tools")
    out = tmp_path / "out"
    proc = run_release(root, "--tag", tag, "--out", str(out), "github-release", "krew-manifest", tools=tools)
    assert proc.returncode == 0, proc.stderr
    calls = (tools / "calls").read_text().splitlines()
    assert [c.split()[:3] for c in calls] == [
        ["gh", "release", "view"],
        ["gh", "release", "create"],
        ["gh", "release", "download"],
        ["gh", "release", "upload"],
    ], calls
    assert calls[1].startswith(f"gh release create {tag} --verify-tag --draft"), calls[1]
    assert calls[3] == f"gh release upload {tag} {out / 'chatbot.yaml'} --clobber"
    spec = yaml.safe_load((out / "chatbot.yaml").read_text())["spec"]
    assert spec["version"] == tag
    assert [p["sha256"] for p in spec["platforms"]] == [str(i) * 64 for i in range(len(PLATFORMS))]

    # a release without one platform's archive gets no manifest
    (tools / "gh").write_text(
        re.sub(r"for entry in \S+ ", "for entry in ", (tools / "gh").read_text(), count=1)
    )
    (out / "chatbot.yaml").unlink()
    for f in out.glob("*.sha256"):
        f.unlink()
    proc = run_release(root, "--tag", tag, "--out", str(out), "krew-manifest", tools=tools)
    assert proc.returncode != 0 and f"has no kubectl-chatbot archive for {PLATFORMS[0]}" in proc.stderr, (
        proc.stderr
    )
    assert not (out / "chatbot.yaml").exists()
