"""Replica stand-ins for the picker's gateway tests: small HTTP servers that answer who they are."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Replica:
    """A replica stand-in: POST answers {"who", "body"}; GET /metrics reports `inflight`."""

    def __init__(self, name: str) -> None:
        self.name, self.inflight = name, 0
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                self._send(json.dumps({"who": replica.name, "body": body.decode()}).encode())

            def do_GET(self):
                self._send(f'chatfleet_inflight_requests{{model="m"}} {replica.inflight}\n'.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
