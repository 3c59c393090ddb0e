"""A static HTTP(S) file server for tests: serves a folder on 127.0.0.1, over TLS when given a certificate.

``python -m chatfleet_platform.servers.fileserver --root DIR --port N [--cert C --key K] [--token T]``
With --token, every request must carry ``Authorization: Bearer T`` (401 otherwise). Paths ending in "/"
are folders: listings are refused (403), so a client must name the files it wants.
"""

from __future__ import annotations

import argparse
import functools
import ssl
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class _Handler(SimpleHTTPRequestHandler):
    token: str | None = None

    def _authorized(self) -> bool:
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_error(401, "missing or wrong bearer token")
            return False
        return True

    def do_GET(self):
        if self._authorized():
            super().do_GET()

    def do_HEAD(self):
        if self._authorized():
            super().do_HEAD()

    def list_directory(self, path):
        self.send_error(403, "no listings")
        return None

    def log_message(self, format, *args):
        print(format % args, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Serve --root on 127.0.0.1:--port (HTTPS with --cert/--key, else plain HTTP) until terminated."""
    parser = argparse.ArgumentParser(description="static HTTPS file server (tests)")
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    handler = type("Handler", (_Handler,), {"token": args.token})
    server = ThreadingHTTPServer(("127.0.0.1", args.port), functools.partial(handler, directory=args.root))
    if args.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.cert, args.key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
