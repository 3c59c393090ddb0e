"""Prometheus (built from Go modules) and Redis (Debian), started on 127.0.0.1 with their own data folders.

Used by tests (as context managers) and by the demo. Each stops exactly the process it started.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import procs
from .config import require_binaries, require_tool

DEBIAN_HINT = "run `make system-deps` (installs the Debian package redis-server)"


@dataclass
class Prometheus:
    """A Prometheus server scraping `targets` (host:port strings, or full scrape_configs)."""

    workdir: Path
    targets: Sequence[str] = ()
    scrape_configs: list[dict] = field(default_factory=list)
    scrape_interval: str = "1s"
    port: int = 0
    proc: procs.Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        """The prometheus.yml content."""
        scrapes = list(self.scrape_configs)
        if self.targets:
            scrapes.append({"job_name": "targets", "static_configs": [{"targets": list(self.targets)}]})
        return {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": scrapes,
        }

    def start(self, timeout: float = 30) -> Prometheus:
        """Start and wait until /-/ready answers."""
        # built from the Go module proxy: Debian's prometheus has no Kubernetes service discovery
        binary = str(require_binaries(("prometheus",)).prometheus)
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.port = self.port or procs.free_port()
        log = self.workdir / "prometheus.log"
        self.proc = procs.start(
            "prometheus",
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log=log,
        )
        procs.wait_for(
            "prometheus", lambda: _get(f"{self.url}/-/ready"), timeout=timeout, log=log, proc=self.proc
        )
        return self

    def reload(self, targets: Sequence[str] | None = None) -> None:
        """Rewrite the scrape targets and reload the configuration."""
        if targets is not None:
            self.targets = targets
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config(), sort_keys=False))
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/-/reload", method="POST"), timeout=5)

    def stop(self) -> None:
        """Stop the server we started."""
        procs.stop(self.proc)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Redis:
    """A redis-server with no persistence, on 127.0.0.1 and the extra addresses of `also_bind`.

    also_bind: host addresses pods can reach, i.e. a real node's bridge address (its node IP) and nothing
    else, so pods on that node share this Redis (`url_at(node_ip)`). With them, protected mode is off (it
    would refuse the pods, since there is no password); the server still listens on those addresses only.
    """

    workdir: Path
    port: int = 0
    proc: procs.Proc | None = None
    also_bind: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def url_at(self, host: str) -> str:
        """redis://host:port/0 for one of the addresses it listens on."""
        if host != "127.0.0.1" and host not in self.also_bind:
            raise ValueError(f"redis listens on 127.0.0.1 and {list(self.also_bind)}, not {host}")
        return f"redis://{host}:{self.port}/0"

    def start(self, timeout: float = 15) -> Redis:
        """Start in the foreground of its own session and wait for PING."""
        binary = require_tool("redis-server", DEBIAN_HINT)
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or procs.free_port()
        log = self.workdir / "redis.log"
        self.proc = procs.start(
            "redis",
            [
                binary,
                "--bind",
                "127.0.0.1",
                *self.also_bind,
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                # protected mode refuses every client but loopback when there is no password: it stays on
                # unless pods are meant to connect, on the bridge address given (host-local, bound explicitly)
                "--protected-mode",
                "no" if self.also_bind else "yes",
            ],
            log=log,
        )
        procs.wait_for(
            "redis", lambda: procs.port_in_use(self.port), timeout=timeout, log=log, proc=self.proc
        )
        return self

    def stop(self) -> None:
        """Stop the server we started."""
        procs.stop(self.proc)

    def __enter__(self) -> Redis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _get(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.status == 200


def wait_until(predicate, timeout: float, interval: float = 0.5):
    """Poll predicate() until it returns a truthy value (returned) or timeout (returns None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None
