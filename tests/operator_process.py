"""The operator under test as a subprocess, shared by the integration and e2e suites.

It runs `python -m chatfleet_operator.cli run` against the session's local cluster, watching the given
namespace patterns, logs to a file per start, writes its stats (passes, latencies, writes) on exit,
serves its /metrics on a loopback port when asked (`scrape()` reads them), and is stopped by its PID
(SIGTERM, or SIGKILL to test restarts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chatfleet_platform.common.config import LOCAL_ANALYSIS_ARGS, LOCAL_HOST_PATH_ARGS
from chatfleet_platform.common.config import REPO_ROOT as REPO
from chatfleet_platform.common.procs import free_port
from chatfleet_platform.servers.services import wait_until
from prometheus_client.parser import text_string_to_metric_families

#: One scraped sample: (name, sorted label pairs).
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class OperatorProcess:
    """The operator under test, as a subprocess with a log file and a stats file."""

    def __init__(
        self,
        cluster: Any,
        workdir: Path,
        scope: tuple[str, ...],
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        serve_metrics: bool = False,
    ) -> None:
        self.cluster, self.workdir, self.scope = cluster, workdir, scope
        self.extra_args = extra_args
        self.env = env or {}
        self.metrics_port = free_port() if serve_metrics else None
        """The loopback port of the operator's /metrics (the same across restarts); None: not served."""
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

    @contextmanager
    def running(self) -> Iterator[OperatorProcess]:
        """Started for the with-block, stopped after it (on an error too): a fixture's `with ... as op: yield op`."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def start(self, namespaces: tuple[str, ...] | None = None) -> None:
        """Start the operator (watching `namespaces`, default its scope); wait until kopf is watching."""
        self.starts += 1
        scope = [arg for ns in (namespaces or self.scope) for arg in ("--namespace", ns)]
        env = {**os.environ, **self.cluster.env, "PYTHONUNBUFFERED": "1", **self.env}
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
                    *LOCAL_ANALYSIS_ARGS,  # the platform's Prometheus and trafficsim are on 127.0.0.1
                    *LOCAL_HOST_PATH_ARGS,  # the tiny models' and the examples' spec.model.hostPath
                    *self.metrics_args(),
                    *self.extra_args,
                ],
                cwd=REPO,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        # a bound, not a speed goal: the integration lane runs at nice 10 beside the real-pod lane, and a
        # loaded run's operator once printed nothing within 30 s (imports and kopf's start)
        ok = wait_until(
            lambda: "Initial authentication has finished" in self.log.read_text(errors="replace"), 90
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

    def restart(self, sig: int = signal.SIGTERM, namespaces: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Stop, then start again (watching `namespaces`); returns the stopped process's stats."""
        stats = self.stop(sig)
        self.start(namespaces)
        return stats

    def metrics_args(self) -> list[str]:
        """The flags that serve /metrics on 127.0.0.1 (none when not asked for)."""
        if self.metrics_port is None:
            return []
        return ["--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}"]

    def scrape(self) -> dict[SampleKey, float]:
        """The operator's /metrics over HTTP, as {(name, labels): value}."""
        assert self.metrics_port is not None, "this operator was started without serve_metrics"
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def log_text(self) -> str:
        """Current log content."""
        return self.log.read_text(errors="replace")
