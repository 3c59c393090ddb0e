"""The release pipeline: .github/workflows/release.yaml and hack/release.sh, validated without publishing.

actionlint (built by `make chart-tools`, pinned in hack/versions.env) passes on every workflow file and
fails on a broken one; the workflow pins every action by commit SHA and gives each job its permissions; the
script's dry run packages and renders the chart at the project's version and runs no docker or cosign, a
tag that disagrees with a version field fails naming it, and the publishing path (on a tagged copy of the
tree, with stand-ins for docker, cosign and `helm push` that record their arguments) signs each pushed digest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from chart_helpers import find, helm, need_helm
from chatfleet_platform.common.config import REPO_ROOT, cache_dir, read_versions
from needs import need_executable

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
RELEASE_WORKFLOW = WORKFLOWS / "release.yaml"
SCRIPT = "hack/release.sh"
CHART_YAML = REPO_ROOT / "charts" / "chatfleet-operator" / "Chart.yaml"
OPERATOR_REPO = "ghcr.io/chatfleet/chatfleet-operator"
RUNTIME_REPO = "ghcr.io/chatfleet/chatfleet-runtime"
CHART_REPO = "oci://ghcr.io/chatfleet/charts"
DIGEST = "sha256:" + "d" * 64
CHART_DIGEST = "sha256:" + "c" * 64


#: The Python packages, each with its own pyproject.toml and one shared version.
PACKAGES = ("contract", "operator", "picker", "runtime", "hack")


def project_version() -> str:
    return tomllib.loads((REPO_ROOT / "operator" / "pyproject.toml").read_text())["project"]["version"]


def actionlint() -> str:
    version = read_versions()["ACTIONLINT_VERSION"]
    path = cache_dir() / "bin" / f"actionlint-{version}" / "actionlint"
    return need_executable("actionlint", "run `make setup` (or `make chart-tools`)", path=path)


def workflow_files(folder: Path = WORKFLOWS) -> list[Path]:
    return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])


def run_actionlint(root: Path) -> subprocess.CompletedProcess[str]:
    files = workflow_files(root / ".github" / "workflows")
    assert files, f"no workflow files under {root}/.github/workflows"
    return subprocess.run(
        [actionlint(), "-no-color", *(str(f.relative_to(root)) for f in files)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def fake_tools(folder: Path) -> Path:
    """Stand-ins for docker and cosign that log their arguments (one line a call) to <folder>/calls.

    docker writes the --metadata-file a real `buildx build --push` writes, with DIGEST.
    """
    folder.mkdir()
    (folder / "docker").write_text(
        "#!/usr/bin/env bash\n"
        'echo "docker $*" >> "$(dirname "$0")/calls"\n'
        "while [ $# -gt 0 ]; do\n"
        '  if [ "$1" = --metadata-file ]; then\n'
        f'    printf \'{{"containerimage.digest": "{DIGEST}"}}\' > "$2"\n'
        "  fi\n"
        "  shift\n"
        "done\n"
    )
    (folder / "cosign").write_text('#!/usr/bin/env bash\necho "cosign $*" >> "$(dirname "$0")/calls"\n')
    # helm as it is, except `push`, which prints what helm's OCI push prints (pkg/registry/client.go)
    (folder / "helm").write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = push ]; then\n'
        '  echo "helm $*" >> "$(dirname "$0")/calls"\n'
        f'  printf "Pushed: %s\\nDigest: %s\\n" "${{3#oci://}}/chatfleet-operator:x" "{CHART_DIGEST}"\n'
        "  exit 0\n"
        "fi\n"
        f'exec "{need_helm()}" "$@"\n'
    )
    for tool in folder.iterdir():
        tool.chmod(0o755)
    return folder


def calls(tools: Path) -> list[str]:
    log = tools / "calls"
    return log.read_text().splitlines() if log.exists() else []


def release(
    root: Path,
    *args: str,
    tools: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run hack/release.sh of `root` with the repository's helm (or the stand-ins of `tools` first on PATH),
    none of the workflow's variables inherited."""
    scrubbed = ("RELEASE_TAG", "RELEASE_DRY_RUN", "PLUGIN_PLATFORM")
    full = {k: v for k, v in os.environ.items() if k not in scrubbed}
    full["HELM"] = str(tools / "helm") if tools else str(need_helm())
    if tools:
        full["PATH"] = f"{tools}{os.pathsep}{full['PATH']}"
    full.update(env or {})
    return subprocess.run(
        ["bash", str(root / SCRIPT), *args],
        cwd=root,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tree_copy(tmp_path: Path) -> Path:
    """What the script reads, copied: to change a version field without touching the repository."""
    root = tmp_path / "repo"
    (root / "hack").mkdir(parents=True)
    for name in ("release.sh", "versions.env"):
        shutil.copy2(REPO_ROOT / "hack" / name, root / "hack" / name)
    shutil.copytree(REPO_ROOT / "charts", root / "charts")
    for name in PACKAGES:
        (root / name).mkdir(exist_ok=True)
        shutil.copy2(REPO_ROOT / name / "pyproject.toml", root / name / "pyproject.toml")
    for name in ("operator", "runtime"):
        shutil.copy2(REPO_ROOT / name / "Dockerfile", root / name / "Dockerfile")
    return root


def tagged(root: Path, tag: str) -> Path:
    """`root` as a git repository with one commit, tagged `tag` (what a real release runs on)."""
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "release")
    git(root, "tag", "-a", tag, "-m", tag)
    return root


def set_versions(root: Path, *, chart: str, app: str, project: str) -> None:
    chart_yaml = root / "charts" / "chatfleet-operator" / "Chart.yaml"
    text = re.sub(r"(?m)^version: .*$", f"version: {chart}", chart_yaml.read_text())
    text = re.sub(r"(?m)^appVersion: .*$", f'appVersion: "{app}"', text)
    chart_yaml.write_text(text)
    for name in PACKAGES:
        pyproject = root / name / "pyproject.toml"
        pyproject.write_text(
            re.sub(r'(?m)^version = ".*"$', f'version = "{project}"', pyproject.read_text(), count=1)
        )


def packaged_chart(tgz: Path) -> dict:
    with tarfile.open(tgz) as tar:
        member = tar.extractfile("chatfleet-operator/Chart.yaml")
        assert member is not None
        return yaml.safe_load(member.read())


# --- the workflow ------------------------------------------------------------------------------------------


def test_actionlint_passes_on_every_workflow() -> None:
    proc = run_actionlint(REPO_ROOT)
    assert proc.returncode == 0, f"actionlint:\n{proc.stdout}{proc.stderr}"


def test_actionlint_fails_on_a_broken_workflow(tmp_path: Path) -> None:
    """The linter can fail: a misspelt permission and an undefined matrix key in a copy of the workflow."""
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    text = RELEASE_WORKFLOW.read_text()
    broken = text.replace("id-token: write # cosign keyless:", "id-tokens: write # cosign keyless:", 1)
    broken = broken.replace("IMAGE: ${{ matrix.image }}", "IMAGE: ${{ matrix.images }}", 1)
    assert broken.count("id-tokens") == 1 and "matrix.images" in broken
    (folder / "release.yaml").write_text(broken)
    proc = run_actionlint(tmp_path)
    assert proc.returncode != 0
    assert "id-tokens" in proc.stdout and "matrix.images" in proc.stdout, proc.stdout


def test_the_workflow_pins_every_action_and_declares_permissions() -> None:
    for path in workflow_files():
        text = path.read_text()
        uses = [line.strip() for line in text.splitlines() if re.match(r"\s*(- )?uses:", line)]
        assert uses, f"{path.name}: no actions used"
        for line in uses:
            assert re.fullmatch(
                r"(- )?uses: ([\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*|\./[\w./-]+)", line
            ), f"{path.name}: not pinned by a commit SHA with its version in a comment: {line}"
        doc = yaml.safe_load(text)
        assert "permissions" in doc, f"{path.name}: no top-level permissions"
        for name, job in doc["jobs"].items():
            assert isinstance(job.get("permissions"), dict), (
                f"{path.name}: job {name} declares no permissions"
            )
            for scope, level in job["permissions"].items():
                assert level in ("read", "write", "none"), f"{path.name}: {name}: {scope}: {level}"


def test_the_release_workflow_runs_the_script_on_a_tag() -> None:
    doc = yaml.safe_load(RELEASE_WORKFLOW.read_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on["push"] == {"tags": ["v*"]}
    dispatch = on["workflow_dispatch"]["inputs"]
    assert dispatch["dry_run"]["type"] == "boolean" and dispatch["dry_run"]["default"] is True
    assert doc["permissions"] == {}, "nothing by default: each job asks for what it uses"
    jobs = doc["jobs"]
    assert set(jobs) == {"verify", "images", "chart", "github-release", "plugin", "krew"}
    assert jobs["images"]["needs"] == "verify" and jobs["chart"]["needs"] == "images"
    assert jobs["verify"]["permissions"] == {"contents": "read"}
    for name in ("images", "chart"):
        assert jobs[name]["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    assert jobs["images"]["strategy"]["matrix"]["image"] == ["operator", "runtime"]
    # the kubectl plugin: the release that holds its files, an archive per platform on its own runner, the manifest
    assert jobs["github-release"]["needs"] == "verify" and jobs["plugin"]["needs"] == "github-release"
    assert jobs["krew"]["needs"] == "plugin"
    for name in ("github-release", "plugin", "krew"):
        assert jobs[name]["permissions"] == {"contents": "write"}, name
    platforms = {row["platform"]: row["runner"] for row in jobs["plugin"]["strategy"]["matrix"]["include"]}
    assert platforms == {
        "linux_amd64": "ubuntu-22.04",
        "linux_arm64": "ubuntu-22.04-arm",
        "darwin_amd64": "macos-15-intel",
        "darwin_arm64": "macos-15",
    }
    assert jobs["plugin"]["runs-on"] == "${{ matrix.runner }}"
    for name, job in jobs.items():
        runs = " ".join(step.get("run", "") for step in job["steps"])
        assert "bash hack/release.sh" in runs, f"job {name} does not run hack/release.sh"


def test_the_docs_verify_command_matches_the_workflow_identity() -> None:
    docs = (REPO_ROOT / "docs" / "chart.md").read_text()
    found = re.findall(r"--certificate-identity-regexp '([^']+)'", docs)
    assert found, "docs/chart.md has no cosign verify --certificate-identity-regexp"
    identity = "https://github.com/chatfleet/chatfleet/.github/workflows/release.yaml@refs/tags/v1.2.3"
    for regexp in found:
        assert re.search(regexp, identity), regexp
        assert not re.search(regexp, identity.replace("release.yaml", "other.yaml")), regexp
        assert not re.search(regexp, identity.replace("refs/tags/v1.2.3", "refs/heads/main")), regexp
    assert "--certificate-oidc-issuer https://token.actions.githubusercontent.com" in docs


# --- the script's dry run ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_dry_run_packages_and_renders_the_projects_version(tmp_path: Path) -> None:
    version = project_version()
    tools = fake_tools(tmp_path / "tools")
    out = tmp_path / "out"
    proc = release(REPO_ROOT, "--dry-run", "--out", str(out), tools=tools)
    assert proc.returncode == 0, proc.stderr
    assert calls(tools) == [], f"a dry run ran a publishing tool: {calls(tools)}"

    tgz = out / f"chatfleet-operator-{version}.tgz"
    assert tgz.exists(), sorted(p.name for p in out.iterdir())
    chart = packaged_chart(tgz)
    assert (chart["version"], chart["appVersion"]) == (version, version)
    docs = [
        d for d in yaml.safe_load_all(helm("template", "cf", str(tgz), "-n", "chatfleet-system").stdout) if d
    ]
    (deployment,) = find(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{OPERATOR_REPO}:{version}"
    assert f"--runtime-image={RUNTIME_REPO}:{version}" in container["args"]

    printed = [line.split("would run: ", 1)[1] for line in proc.stdout.splitlines() if "would run: " in line]
    builds = [line for line in printed if line.startswith("docker buildx build")]
    assert len(builds) == 2, printed
    operator, runtime = builds
    for line, platforms in ((operator, "linux/amd64,linux/arm64"), (runtime, "linux/amd64")):
        assert f"--platform {platforms} " in line
        for flag in ("--sbom=true", "--provenance=mode=max", "--push", f"--build-arg VERSION={version}"):
            assert flag in line, (flag, line)
    assert "--file operator/Dockerfile --platform linux/amd64,linux/arm64" in operator
    assert f"--tag {OPERATOR_REPO}:{version}" in operator and f"--tag {RUNTIME_REPO}:{version}" in runtime
    signs = [line for line in printed if line.startswith("cosign sign --yes")]
    assert [s.split()[3].strip("'").split("@")[0] for s in signs] == [
        OPERATOR_REPO,
        RUNTIME_REPO,
        "ghcr.io/chatfleet/charts/chatfleet-operator",
    ]
    assert any(line.endswith(f" push {tgz} {CHART_REPO}") for line in printed), printed


def test_the_chart_and_the_project_share_the_version() -> None:
    chart = yaml.safe_load(CHART_YAML.read_text())
    assert chart["version"] == chart["appVersion"] == project_version(), (
        "Chart.yaml version, appVersion and the packages' pyproject.toml version are released together (docs/chart.md)"
    )


@pytest.mark.slow
def test_a_tag_that_disagrees_fails_naming_each_field(tmp_path: Path) -> None:
    version = project_version()
    root = tree_copy(tmp_path)
    set_versions(root, chart=version, app="9.9.9", project=version)
    proc = release(root, "--dry-run", "--tag", f"v{version}", "--out", str(tmp_path / "out"))
    assert proc.returncode != 0
    assert "Chart.yaml appVersion is '9.9.9'" in proc.stderr, proc.stderr
    assert "Chart.yaml version is" not in proc.stderr and "pyproject.toml" not in proc.stderr, proc.stderr
    assert not list((tmp_path / "out").glob("*.tgz")), "nothing is packaged for a tag that disagrees"

    proc = release(REPO_ROOT, "--dry-run", "--tag", "v99.0.0", "--out", str(tmp_path / "out2"))
    assert proc.returncode != 0
    for field in (
        f"Chart.yaml version is '{version}'",
        f"Chart.yaml appVersion is '{version}'",
        f"pyproject.toml [project] version is '{version}'",
    ):
        assert field in proc.stderr, (field, proc.stderr)

    for bad in ("1.2.3", "v1.2", "v1.2.3+build.1", "v01.2.3"):
        proc = release(REPO_ROOT, "--dry-run", "--tag", bad, "--out", str(tmp_path / "out3"))
        assert proc.returncode != 0 and "is not vMAJOR.MINOR.PATCH" in proc.stderr, (bad, proc.stderr)


@pytest.mark.slow
def test_a_pre_release_tag_matches_the_pep440_spelling(tmp_path: Path) -> None:
    root = tree_copy(tmp_path)
    set_versions(root, chart="2.0.0-rc.1", app="2.0.0-rc.1", project="2.0.0rc1")
    out = tmp_path / "out"
    proc = release(root, "--dry-run", "--tag", "v2.0.0-rc.1", "--out", str(out), "verify")
    assert proc.returncode == 0, proc.stderr
    chart = packaged_chart(out / "chatfleet-operator-2.0.0-rc.1.tgz")
    assert (chart["version"], chart["appVersion"]) == ("2.0.0-rc.1", "2.0.0-rc.1")


# --- the publishing path, with stand-ins ------------------------------------------------------------------


def git(root: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    proc = subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


@pytest.mark.slow
def test_a_release_pushes_and_signs_each_digest(tmp_path: Path) -> None:
    version = project_version()
    tag = f"v{version}"
    root = tagged(tree_copy(tmp_path), tag)
    tools = fake_tools(tmp_path / "tools")
    out = tmp_path / "out"
    summary = tmp_path / "summary.md"
    env = {
        "TRITON_IMAGE": "registry.example/nvidia/tritonserver:25.01-py3",
        "GITHUB_STEP_SUMMARY": str(summary),
    }

    # without the tag at HEAD, or with a changed tree, nothing is built
    git(root, "commit", "-q", "--allow-empty", "-m", "after the tag")
    proc = release(root, "--tag", tag, "--out", str(out), tools=tools, env=env)
    assert proc.returncode != 0 and f"tag {tag} names" in proc.stderr and calls(tools) == [], proc.stderr
    git(root, "reset", "-q", "--hard", tag)
    (root / "stray").write_text("x")
    proc = release(root, "--tag", tag, "--out", str(out), tools=tools, env=env)
    assert proc.returncode != 0 and "work tree has changes" in proc.stderr and calls(tools) == []
    (root / "stray").unlink()

    proc = release(root, "--tag", tag, "--out", str(out), tools=tools, env=env)
    assert proc.returncode == 0, proc.stderr
    head = git(root, "rev-parse", "HEAD")
    logged = calls(tools)
    assert [c.split()[0:3] for c in logged] == [
        ["docker", "buildx", "build"],
        ["cosign", "sign", "--yes"],
        ["docker", "buildx", "build"],
        ["cosign", "sign", "--yes"],
        ["helm", "push", str(out / f"chatfleet-operator-{version}.tgz")],
        ["cosign", "sign", "--yes"],
    ], logged
    assert f"--build-arg REVISION={head}" in logged[0] and "--push" in logged[0]
    assert "--build-arg TRITON_IMAGE=registry.example/nvidia/tritonserver:25.01-py3" in logged[2]
    assert logged[1] == f"cosign sign --yes {OPERATOR_REPO}@{DIGEST}"
    assert logged[3] == f"cosign sign --yes {RUNTIME_REPO}@{DIGEST}"
    assert logged[5] == f"cosign sign --yes ghcr.io/chatfleet/charts/chatfleet-operator@{CHART_DIGEST}"
    assert (out / "operator.digest").read_text().strip() == f"{OPERATOR_REPO}@{DIGEST}"
    assert CHART_DIGEST in summary.read_text() and DIGEST in summary.read_text()
