"""Streamed chats through the platform's Traefik end with their last event, every one.

Test design: a chat answer is a POST with a JSON body (Content-Length) answered at once with a chunked
server-sent-event stream. Through Traefik's default proxy (Go's httputil ReverseProxy) some of them are
cut under load (Go issue 40747, see chatfleet_platform.addons.gateway): the transport's late second read
of the request body fails once the server has written the response headers, and it closes the upstream
connection mid-answer. The platform runs Traefik's fast proxy, which writes the whole request first.

One HTTPRoute to a Service whose EndpointSlice points at a threaded HTTP server on a host address
(hostbackends.HostAddress, as in test_gateway_mirroring). USERS client threads send REQUESTS streamed
POSTs in all, a new connection each (as the dialogue load does), and each answer must arrive whole: every
event and `data: [DONE]`. With the default proxy a run cut 71 of the 12,000 on this 2-core machine. No
wall-clock assertion: only a bound on how long the batch may take.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import batch
import pytest
from chatfleet_platform.common.config import PlatformError
from chatfleet_platform.servers import hostbackends
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.harness, pytest.mark.slow]

BOT = "streams"
USERS = 32
REQUESTS = 12_000
EVENTS = 6
BATCH_LIMIT_S = 600
"""A bound, not a speed goal: the batch takes about a minute here."""


def event(i: int) -> bytes:
    return (
        b"data: "
        + json.dumps({"choices": [{"delta": {"content": f"token {i} " + "x" * 80}}]}).encode()
        + b"\n\n"
    )


DONE = b"data: [DONE]\n\n"
WHOLE = b"".join(event(i) for i in range(EVENTS)) + DONE


class Handler(BaseHTTPRequestHandler):
    """POST: read the body, answer at once with EVENTS events and [DONE], one chunk each."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for data in [*(event(i) for i in range(EVENTS)), DONE]:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the proxy closed this connection mid-answer: the client counts the cut
            self.close_connection = True

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def backend() -> Iterator[ThreadingHTTPServer]:
    from needs import missing

    host = hostbackends.HostAddress()
    try:
        host.open()
    except PlatformError as exc:
        missing("a host address for the backend", str(exc))
    server = ThreadingHTTPServer((host.address, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        host.close()


def whole(resp: http.client.HTTPResponse) -> str:
    """'ok', 'cut' (200, answer not whole) or the status that came instead."""
    if resp.status != 200:
        return f"http-{resp.status}"
    try:
        data = resp.read()
    except (http.client.HTTPException, OSError):
        return "cut"
    return "ok" if data == WHOLE else "cut"


def chat(port: int, host: str, i: int) -> str:
    """One streamed chat on a new connection: 'ok', 'cut' (200, answer not whole) or what went wrong."""
    body = {"messages": [{"role": "user", "content": f"hello {i}"}], "stream": True}
    return batch.gateway_chat(port, host, body, whole)


def test_streamed_chats_through_traefik_are_never_cut(cluster, gateway, backend, namespace):
    ns = namespace
    host = f"{ns}.streams.chatfleet.test"
    address, port = backend.server_address[:2]
    cluster.apply(
        [
            hostbackends.selectorless_service(BOT, ns, 8080),
            hostbackends.endpoint_slice(BOT, ns, address, port),
            gateway.route(BOT, ns, host, [{"backendRefs": [{"name": BOT, "port": 8080}]}]),
        ]
    )
    assert wait_until(lambda: chat(gateway.port, host, -1) == "ok", 60, 0.5), chat(gateway.port, host, -1)

    outcomes = batch.outcomes(lambda i: chat(gateway.port, host, i), REQUESTS, USERS, BATCH_LIMIT_S)
    assert sum(outcomes.values()) == REQUESTS, f"not all {REQUESTS} sent within {BATCH_LIMIT_S}s: {outcomes}"
    assert outcomes == {"ok": REQUESTS}, f"{dict(outcomes)} of {REQUESTS} streamed chats through Traefik"
