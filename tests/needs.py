"""Real parts the tests need. A missing one fails the test with how to get it: tests never skip.

`make setup` installs or builds every one of them (Python extras, Debian packages, platform binaries,
chart tools), so under `make test` a missing part is a broken setup, and that must show as a failure,
not as a quietly shorter test run.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

SETUP = "run `make setup`"


def missing(what: str, how: str = SETUP) -> NoReturn:
    """Fail the current test: `<what> is missing: <how>`."""
    pytest.fail(f"{what} is missing: {how}", pytrace=False)


def need_module(name: str, how: str = SETUP) -> ModuleType:
    """Import a module the tests need, or fail naming it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"the Python module {name} ({exc})", how)


def need_executable(name: str, how: str = SETUP, path: Path | None = None) -> str:
    """The path of an executable the tests need (`path` if given, else on PATH), or fail naming it."""
    if path is not None:
        if path.exists():
            return str(path)
        missing(f"{name} (expected at {path})", how)
    found = shutil.which(name)
    if found is None:
        missing(f"{name} (not on PATH)", how)
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """Report any skip as a failure (with its reason): a test that does not run must not look fine."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"tests never skip, but this one did: {reason}"
