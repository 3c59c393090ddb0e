"""A recording proxy in front of the API server: plain HTTP on 127.0.0.1 in, TLS to the API server out.

The RBAC proof points the operator's kubeconfig at it, so every request the operator sends (kopf's and
kube.py's) is recorded with its answer, and mapped to the RBAC permission it needs. HTTP/1.1 only
(what urllib3 and aiohttp speak to an http:// server); watch streams are relayed chunk by chunk.
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit


@dataclass
class Record:
    """One request and the status of its answer (None until the answer's status line arrives)."""

    method: str
    path: str
    content_type: str = ""
    status: int | None = None

    def permission(self) -> tuple[str, str, str, str | None] | None:
        """(apiGroup, resource[/subresource], verb, namespace) this request needs; None for discovery."""
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, rest = parts[1], parts[3:]
        else:
            return None  # /api, /apis, /version, /openapi: discovery, allowed to every authenticated user
        if not rest:
            return None
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        query = parse_qs(url.query)
        verb = {
            "GET": "get" if name else ("watch" if query.get("watch", [""])[0] in ("true", "1") else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }[self.method]
        return group, f"{resource}/{sub}" if sub else resource, verb, namespace

    def creates_by_apply(self) -> bool:
        """A server-side apply that created the object (authorized as create as well as patch)."""
        return self.method == "PATCH" and "apply-patch" in self.content_type and self.status == 201


def _read_head(reader: BinaryIO) -> tuple[bytes, dict[str, str]] | None:
    """Start line + headers (raw bytes kept for relaying); None at EOF."""
    raw = reader.readline()
    if not raw:
        return None
    head = raw
    headers: dict[str, str] = {}
    while True:
        line = reader.readline()
        if not line:
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            break
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    return head, headers


def _relay_body(reader: BinaryIO, writer: socket.socket, headers: dict[str, str], to_eof: bool) -> None:
    """Copy one message body: chunked, by Content-Length, or (answers only) until EOF."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = reader.readline()
            if not size_line:
                raise EOFError
            writer.sendall(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    line = reader.readline()
                    writer.sendall(line)
                    if line in (b"\r\n", b"\n", b""):
                        return
            data = reader.read(size + 2)  # chunk + CRLF
            writer.sendall(data)
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining:
            data = reader.read(min(remaining, 65536))
            if not data:
                raise EOFError
            writer.sendall(data)
            remaining -= len(data)
    elif to_eof:
        while data := reader.read1(65536):
            writer.sendall(data)


class RecordingProxy:
    """Forward http://127.0.0.1:PORT to the API server, recording every request (thread-based)."""

    def __init__(self, upstream: str, cafile: Path) -> None:
        url = urlsplit(upstream)
        self.host, self.upstream_port = url.hostname or "127.0.0.1", url.port or 443
        self.ctx = ssl.create_default_context(cafile=str(cafile))
        self.ctx.set_alpn_protocols(["http/1.1"])
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        """Where clients connect."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RecordingProxy:
        """Accept connections in a background thread."""
        threading.Thread(target=self._accept, name="apiproxy-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped.set()
        self._sock.close()
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                raw = socket.create_connection((self.host, self.upstream_port), timeout=10)
                upstream = self.ctx.wrap_socket(raw, server_hostname=self.host)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._serve, args=(client, upstream), daemon=True).start()

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        """One connection, one request at a time (clients do not pipeline; a TLS socket must not be read
        and written from two threads at once): request in, record, forward, answer back, repeat."""
        from_client = client.makefile("rb")
        from_upstream = upstream.makefile("rb")
        try:
            while (head := _read_head(from_client)) is not None:
                raw, headers = head
                method, path, _ = raw.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
                record = Record(method, path, headers.get("content-type", ""))
                with self._lock:
                    self.records.append(record)
                upstream.sendall(raw)
                _relay_body(from_client, upstream, headers, to_eof=False)
                while True:
                    answer = _read_head(from_upstream)
                    if answer is None:
                        return
                    raw, headers = answer
                    status = int(raw.split(b" ", 2)[1])
                    client.sendall(raw)
                    if status != 100:
                        break
                record.status = status
                if method != "HEAD" and status not in (204, 304):
                    _relay_body(from_upstream, client, headers, to_eof=True)
        except (OSError, EOFError, ValueError):
            pass
        finally:
            _close(client, upstream)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            s.close()
        except OSError:
            pass
