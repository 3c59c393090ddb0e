"""Prometheus (built from Go modules) and Redis (Debian), started on 127.0.0.1 with their own data folders.

Used by tests (as context managers) and by the demo. Each stops exactly the process it started.
Prometheus serves https when given a certificate (its web config's tls_server_config); BearerProxy stands
in front of one where a test needs a bearer token checked, which Prometheus' web config cannot do.
"""

from __future__ import annotations

import hmac
import os
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from chatfleet_platform.common import pki, procs
from chatfleet_platform.common.config import require_binaries, require_tool

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
    tls: tuple[Path, Path, Path] | None = None
    """(CA, certificate, key) as pki.serving_pair writes them: serve https only (--web.config.file with
    tls_server_config), checked here against that CA. None: plain http."""

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context trusting this server's CA (None over http)."""
        return ssl.create_default_context(cafile=str(self.tls[0])) if self.tls else None

    def web_config(self) -> dict:
        """The --web.config.file content: the serving certificate and key."""
        assert self.tls, "a web config only for a Prometheus with tls"
        _, cert, key = self.tls
        return {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}}

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
        web: list[str] = []
        if self.tls:
            web_cfg = self.workdir / "web.yml"
            web_cfg.write_text(yaml.safe_dump(self.web_config(), sort_keys=False))
            web = [f"--web.config.file={web_cfg}"]
        self.proc = procs.start(
            "prometheus",
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *web,
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log=log,
        )
        procs.wait_for(
            "prometheus",
            lambda: procs.http_ok(f"{self.url}/-/ready", self.ssl_context),
            timeout=timeout,
            log=log,
            proc=self.proc,
        )
        return self

    def reload(self, targets: Sequence[str] | None = None) -> None:
        """Rewrite the scrape targets and reload the configuration."""
        if targets is not None:
            self.targets = targets
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config(), sort_keys=False))
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        urllib.request.urlopen(request, timeout=5, context=self.ssl_context)

    def stop(self) -> None:
        """Stop the server we started."""
        procs.stop(self.proc)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Redis:
    """A redis-server on 127.0.0.1 and the extra addresses of `also_bind`; no persistence unless `persistent`
    (an append-only file in `workdir`: a process killed and started again keeps every write it answered).

    also_bind: host addresses pods can reach, i.e. a real node's bridge address (its node IP) and nothing
    else, so pods on that node share this Redis (`url_at(node_ip)`). With them, protected mode is off (it
    would refuse the pods, since there is no password); the server still listens on those addresses only.
    """

    workdir: Path
    port: int = 0
    proc: procs.Proc | None = None
    also_bind: tuple[str, ...] = ()
    persistent: bool = False

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
                "yes" if self.persistent else "no",
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

    def kill(self) -> None:
        """SIGKILL it (a crash: no shutdown, no save) and wait until its port is free."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
        procs.wait_for("redis gone", lambda: not procs.port_in_use(self.port), timeout=10)

    def __enter__(self) -> Redis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class BearerProxy:
    """An https reverse proxy on 127.0.0.1 that passes a request on to `upstream` only with
    `Authorization: Bearer <token>`, answering 401 otherwise -- what kube-rbac-proxy or an OAuth proxy does
    in front of a Prometheus, whose own web config knows basic auth but no bearer tokens.

    Its serving certificate comes from a CA of its own (`ca`). `token` may be changed while it runs (a
    rotation); `seen` holds the Authorization header of every request, None where there was none.
    """

    workdir: Path
    upstream: str
    token: str
    upstream_context: ssl.SSLContext | None = None
    """How the upstream's certificate is checked (e.g. Prometheus.ssl_context); None: the system's CAs."""
    seen: list[str | None] = field(default_factory=list)
    ca: Path | None = None
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> BearerProxy:
        """Serve on a free loopback port, in a daemon thread."""
        self.ca, cert, key = pki.serving_pair(Path(self.workdir), "bearer-proxy")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                auth = self.headers.get("Authorization")
                proxy.seen.append(auth)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                if not hmac.compare_digest((auth or "").encode(), f"Bearer {proxy.token}".encode()):
                    self._send(401, b"Unauthorized\n", "text/plain")
                    return
                request = urllib.request.Request(proxy.upstream + self.path, data=body, method=self.command)
                if self.headers.get("Content-Type"):
                    request.add_header("Content-Type", self.headers["Content-Type"])
                try:
                    with urllib.request.urlopen(request, timeout=10, context=proxy.upstream_context) as r:
                        self._send(r.status, r.read(), r.headers.get("Content-Type", "text/plain"))
                except urllib.error.HTTPError as exc:
                    self._send(exc.code, exc.read(), exc.headers.get("Content-Type", "text/plain"))

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="bearer-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> BearerProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until(predicate, timeout: float, interval: float = 0.5):
    """Poll predicate() until it returns a truthy value (returned) or timeout (returns None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None
