"""The four Python packages install apart: each pyproject.toml declares what its package imports.

contract/, operator/, picker/ and runtime/ are distributions of their own (the images install exactly
theirs: operator/Dockerfile the contract, the operator and the picker; runtime/Dockerfile the contract and
the runtime). A package that imported a library only another package declares would install, and then
die at import, wherever it is installed alone.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "contract": "chatfleet_contract",
    "operator": "chatfleet_operator",
    "picker": "chatfleet_picker",
    "runtime": "chatfleet_runtime",
}
#: Modules the environment provides, no distribution: Triton's Python backend gives its model code
#: triton_python_backend_utils inside the server.
PROVIDED = {"triton_python_backend_utils"}


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return norm(re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0])


def project(folder: str) -> dict:
    with (REPO_ROOT / folder / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]


@cache
def closure(names: frozenset[str]) -> frozenset[str]:
    """The distributions `names` (requirement strings) bring when installed: themselves and what they
    require, through the extras they ask for (envoy-data-plane asks betterproto2[all], which brings grpclib)."""
    seen: set[tuple[str, str]] = set()
    todo = [(norm(r.name), e) for r in map(Requirement, names) for e in ("", *sorted(r.extras))]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            reqs = [Requirement(r) for r in requires(name) or []]
        except PackageNotFoundError:
            continue
        for r in reqs:
            if r.marker is None or r.marker.evaluate({"extra": extra}):
                todo += [(norm(r.name), e) for e in ("", *sorted(r.extras))]
    return frozenset(name for name, _ in seen)


def third_party_imports(folder: str, package: str) -> set[str]:
    """Top-level modules the package imports, standard library and its own aside."""
    found: set[str] = set()
    for f in (REPO_ROOT / folder / package).rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != package}


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_each_package_declares_what_it_imports(folder):
    brought = closure(frozenset(project(folder)["dependencies"]))
    by_module = packages_distributions()
    missing = {}
    for module in sorted(third_party_imports(folder, PACKAGES[folder]) - PROVIDED):
        dists = {norm(d) for d in by_module.get(module, [])}
        if not dists & brought:
            missing[module] = sorted(dists) or "no distribution installed"
    assert not missing, f"{folder}/pyproject.toml does not bring what {PACKAGES[folder]} imports: {missing}"


def test_the_packages_share_one_version_and_name_each_other_at_it():
    versions = {folder: project(folder)["version"] for folder in [*PACKAGES, "hack"]}
    assert len(set(versions.values())) == 1, versions
    (version,) = set(versions.values())
    for folder in [*PACKAGES, "hack"]:
        for r in project(folder)["dependencies"]:
            if r.startswith("chatfleet-"):
                assert r.endswith(f"=={version}"), (folder, r)


def test_the_operator_and_the_runtime_never_depend_on_each_other():
    assert not any(r.startswith("chatfleet-runtime") for r in project("operator")["dependencies"])
    assert not any(r.startswith("chatfleet-operator") for r in project("runtime")["dependencies"])
    assert "torch" not in closure(frozenset(project("operator")["dependencies"])), (
        "the operator would pull torch"
    )
