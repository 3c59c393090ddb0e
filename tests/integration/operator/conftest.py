"""Operator integration fixtures: the CRD, one operator process per session (restartable), helpers.

The operator runs as `python -m chatfleet_operator.cli run` in a subprocess against the session's local
cluster, logs to a file, and is stopped by its PID (SIGTERM, or SIGKILL for the restart test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_it import Kube, wait_until

REPO = Path(__file__).resolve().parents[3]


class OperatorProcess:
    """The operator under test, as a subprocess with a log file and a stats file."""

    def __init__(self, cluster: Any, workdir: Path) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        """Log file of the current process."""
        return self.workdir / f"operator-{self.starts}.log"

    @property
    def stats_file(self) -> Path:
        """Stats (passes, latencies, writes) of the current process, written on exit."""
        return self.workdir / f"stats-{self.starts}.json"

    #: What the suite's operator watches: everything but the e2e suite's namespaces.
    SUITE_SCOPE = ("!e2e-*",)

    def start(self, namespaces: tuple[str, ...] = SUITE_SCOPE) -> None:
        """Start the operator (watching `namespaces`) and wait until kopf has logged in and is watching."""
        self.starts += 1
        scope = [arg for ns in namespaces for arg in ("--namespace", ns)]
        env = {**os.environ, **self.cluster.env, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "chatfleet_operator.cli",
                    "run",
                    *scope,
                    "--stats-file",
                    str(self.stats_file),
                ],
                cwd=REPO,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        ok = wait_until(
            lambda: "Initial authentication has finished" in self.log.read_text(errors="replace"), 30
        )
        assert ok, f"operator did not start:\n{self.log.read_text(errors='replace')[-3000:]}"
        time.sleep(1.0)  # let the watches list once

    def stop(self, sig: int = signal.SIGTERM) -> dict[str, Any]:
        """Stop the process by PID; returns its stats (empty after SIGKILL)."""
        if self.proc is None:
            return {}
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
        try:
            return json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return {}

    def restart(self, sig: int = signal.SIGTERM, namespaces: tuple[str, ...] = SUITE_SCOPE) -> dict[str, Any]:
        """Stop, then start again (watching `namespaces`); returns the stopped process's stats."""
        stats = self.stop(sig)
        self.start(namespaces)
        return stats

    def log_text(self) -> str:
        """Current log content."""
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def operator(chatfleet_crd, tmp_path_factory) -> Iterator[OperatorProcess]:
    """One operator process for the session (tests may restart it)."""
    op = OperatorProcess(chatfleet_crd, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def kube(operator, namespace) -> Kube:
    """kubectl helpers in a fresh namespace, with the operator running."""
    return Kube(operator.cluster, namespace)
