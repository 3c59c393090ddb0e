"""The production Dockerfiles' structure: what the images need, in an order that caches.

The operator image once died with `ModuleNotFoundError: No module named 'chatfleet_runtime'`; these
checks, and the import check the build itself runs, would have caught it. Today the operator needs only
the pod-contract package (`chatfleet_contract`), and the runtime image never carries the development
package (`chatfleet_platform`).
"""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from chatfleet_platform.common.config import REPO_ROOT

OPERATOR_DOCKERFILE = REPO_ROOT / "operator" / "Dockerfile"
RUNTIME_DOCKERFILE = REPO_ROOT / "runtime" / "Dockerfile"


def _instructions(path: Path) -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    out: list[str] = []
    cur = ""
    for line in path.read_text().splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").rstrip() + " "
        if not line.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def _first_party_imports(package_dir: Path) -> set[str]:
    """Top-level chatfleet_* packages imported anywhere under package_dir (other than itself)."""
    found: set[str] = set()
    for f in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            found.update(n.split(".")[0] for n in names if n.startswith("chatfleet_"))
    return found - {package_dir.name}


def _copied_packages(dockerfile: Path) -> set[str]:
    """The chatfleet_* packages a Dockerfile copies into its build."""
    return {
        m.group(1)
        for ins in _instructions(dockerfile)
        if (m := re.match(r"COPY (?:contract|operator|runtime|hack)/(chatfleet_\w+)/? ", ins))
    }


def test_operator_image_copies_every_first_party_package_the_operator_imports():
    copied = _copied_packages(OPERATOR_DOCKERFILE)
    needed = _first_party_imports(REPO_ROOT / "operator" / "chatfleet_operator")
    assert "chatfleet_contract" in needed  # builders/tritonconfig.py renders the Triton config with it
    missing = needed - copied
    assert not missing, (
        f"operator/Dockerfile does not copy {sorted(missing)}: the image dies with ModuleNotFoundError"
    )


def test_operator_image_carries_the_contract_but_not_the_runtime():
    assert "chatfleet_runtime" not in _first_party_imports(REPO_ROOT / "operator" / "chatfleet_operator")
    assert _copied_packages(OPERATOR_DOCKERFILE) == {"chatfleet_contract", "chatfleet_operator"}
    runs = " ".join(i for i in _instructions(OPERATOR_DOCKERFILE) if i.startswith("RUN "))
    assert '! python -c "import chatfleet_runtime"' in runs


def test_runtime_image_copies_what_the_runtime_imports_and_no_development_package():
    needed = _first_party_imports(REPO_ROOT / "runtime" / "chatfleet_runtime")
    assert needed == {"chatfleet_contract"}, "the runtime imports only the pod-contract package"
    assert _copied_packages(RUNTIME_DOCKERFILE) == {"chatfleet_contract", "chatfleet_runtime"}
    runs = " ".join(i for i in _instructions(RUNTIME_DOCKERFILE) if i.startswith("RUN "))
    assert '! python3 -c "import chatfleet_platform"' in runs


def test_operator_image_build_imports_every_handler_module_and_not_torch():
    runs = " ".join(i for i in _instructions(OPERATOR_DOCKERFILE) if i.startswith("RUN "))
    # cli.py imports main lazily: importing the CLI alone does not prove the handlers import
    assert re.search(r'python -c "import chatfleet_operator\.main\b', runs)
    assert '! python -c "import torch"' in runs or '! /opt/venv/bin/python -c "import torch"' in runs


@pytest.mark.parametrize("dockerfile", [OPERATOR_DOCKERFILE, RUNTIME_DOCKERFILE], ids=["operator", "runtime"])
def test_dependencies_install_before_any_code_is_copied(dockerfile):
    ins = _instructions(dockerfile)
    first_code = min(
        i
        for i, x in enumerate(ins)
        if re.match(r"COPY (contract|operator|picker|runtime|hack)/chatfleet_", x)
    )
    deps = [i for i, x in enumerate(ins) if x.startswith("RUN ") and '["dependencies"]' in x]
    assert deps and max(deps) < first_code
    before = [x for x in ins[: max(deps)] if x.startswith("COPY ") and "--from" not in x]
    assert all(src.endswith("/pyproject.toml") for x in before for src in x.split()[1:-1]), before


def test_runtime_dependency_layer_is_keyed_by_the_requirement_list_alone():
    # the ~6 GB layer: an edit of pyproject.toml's other tables (tool settings) reinstalled it, and every
    # real node imported the whole image again; in the final stage only the extracted list comes before it
    ins = _instructions(RUNTIME_DOCKERFILE)
    stage = ins[max(i for i, x in enumerate(ins) if x.startswith("FROM ")) :]
    install = next(i for i, x in enumerate(stage) if x.startswith("RUN ") and "pip install -r" in x)
    copies = [x for x in stage[:install] if x.startswith("COPY ")]
    assert copies == ["COPY --from=requirements /requirements.txt /tmp/requirements.txt"], copies


@pytest.mark.parametrize(
    ("dockerfile", "arg"), [(OPERATOR_DOCKERFILE, "PYTHON_IMAGE"), (RUNTIME_DOCKERFILE, "TRITON_IMAGE")]
)
def test_base_is_a_build_argument(dockerfile, arg):
    ins = _instructions(dockerfile)
    assert any(i.startswith(f"ARG {arg}=") for i in ins)
    assert all(i.split()[1] in (f"${{{arg}}}", "deps") for i in ins if i.startswith("FROM "))


def test_runtime_image_does_not_force_a_tritonserver_home():
    # the local base has no /opt/tritonserver: the launcher must be free to fall back to the pytriton wheel
    assert "TRITONSERVER_HOME" not in " ".join(
        i for i in _instructions(RUNTIME_DOCKERFILE) if i.startswith("ENV ")
    )


@pytest.mark.parametrize(
    ("dockerfile", "packages"),
    [(OPERATOR_DOCKERFILE, ("operator", "picker")), (RUNTIME_DOCKERFILE, ("runtime",))],
)
def test_dockerfile_requirement_line_reads_the_packages_dependencies(tmp_path, dockerfile, packages):
    """The operator's image carries the endpoint picker too (the operator runs it from its own image); the
    project's own packages (chatfleet-*) come as wheels of the repository, not from the index."""
    run = next(i for i in _instructions(dockerfile) if '["dependencies"]' in i)
    m = re.search(r"python3? -c '([^']+)'((?: [\w/]+/pyproject\.toml)+) >", run)
    cmd, files = m.group(1), m.group(2).split()
    assert files == [f"{p}/pyproject.toml" for p in packages]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((REPO_ROOT / name).read_bytes())
    out = subprocess.run(
        [sys.executable, "-c", cmd, *files], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    wanted = set()
    for name in files:
        with (REPO_ROOT / name).open("rb") as f:
            wanted |= {
                r for r in tomllib.load(f)["project"]["dependencies"] if not r.startswith("chatfleet-")
            }
    assert sorted(out) == sorted(wanted)
    assert "torch==" not in " ".join(out) or packages == ("runtime",)
