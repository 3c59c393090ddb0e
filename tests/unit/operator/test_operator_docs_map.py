"""docs/operator.md's map ("Where things live") matches the operator package: every module is named (by
its path or its package's), and every path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGE = REPO_ROOT / "operator" / "chatfleet_operator"


def map_rows() -> list[list[str]]:
    """The backticked names in the first column of each row of the map, in order."""
    text = (REPO_ROOT / "docs" / "operator.md").read_text()
    table = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]+)`", row.split(" | ", 1)[0]) for row in rows]


def named_paths() -> set[str]:
    """The paths the map names, relative to the package: a bare module name in a row is in the folder of
    the row's first path (`autoscale/forecast.py`, `modelload.py` -> autoscale/modelload.py); a name in
    brackets after a package (`release/canary/` (`strategy.py`)) is inside that package."""
    paths: set[str] = set()
    for names in map_rows():
        first = names[0]
        folder = first if first.endswith("/") else (first.rsplit("/", 1)[0] + "/" if "/" in first else "")
        for name in names:
            paths.add(name if "/" in name or name == first else folder + name)
    return paths


def modules() -> set[str]:
    """Every module of the package (its __init__ files aside), relative to it."""
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def test_every_module_of_the_operator_is_on_the_map():
    named = named_paths()
    folders = {n for n in named if n.endswith("/")}
    missing = sorted(m for m in modules() if m not in named and not any(m.startswith(f) for f in folders))
    assert not missing, f"docs/operator.md 'Where things live' does not name: {missing}"


def test_every_path_on_the_map_exists():
    stale = sorted(n for n in named_paths() if not (PACKAGE / n).exists())
    assert not stale, f"docs/operator.md 'Where things live' names what is not in the package: {stale}"
