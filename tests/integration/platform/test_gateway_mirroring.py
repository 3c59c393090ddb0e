"""A shadow phase's data path on the real Traefik: an HTTPRoute to a TraefikService that mirrors.

Test design: Traefik 3.6 (the `gateway` fixture, with its kubernetescrd provider) does not implement the
HTTPRoute RequestMirror filter, so the operator's shadow phase routes the weighted rule to a TraefikService
`<name>-mirror` whose `spec.mirroring` sends every request to Service `<name>` (the stable pods' chat port,
8080) and P % of them to Service `<name>-shadow` (the canary pods' shadow port, 8081). Here the pods are
small HTTP servers on this host: the API server refuses loopback endpoint addresses, so they listen on a
/32 address of a bridge of their own (hostbackends.HostAddress, needs root) and each Service gets a
hand-made EndpointSlice. Each backend records every request (its x-request-id and body) and answers with
its own name.

- 40 requests: every one answered 200 by stable; the shadow gets copies of about 25 % of them (Traefik's
  mirror counter is deterministic: 10), with the same body; the header-matched rule (plain Service
  `<name>-canary`) is answered by canary and mirrors nothing.
- A streamed answer (5 chunks, each written only once the client has read the one before) arrives whole
  and chunk by chunk with a mirror at 100 %, and the shadow gets its copy only after that answer ended;
  a client that hangs up mid-stream gets no copy sent at all.
- A shadow Service without a Ready endpoint (the canary's pod lost or not Ready yet) costs nothing: the
  platform runs Traefik with allowEmptyServices (with Traefik's default the TraefikService is not built
  and the whole rule answers 404 while the route's status still reads Accepted). Pinned as in Traefik
  3.6.12: a RequestMirror filter makes its rule answer 500, status unchanged.

Waits are bounded polls; requests go to Traefik on 127.0.0.1 with the route's own hostname.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from chatfleet_platform.addons import traefikcrd
from chatfleet_platform.common.config import PlatformError
from chatfleet_platform.servers import hostbackends
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.harness, pytest.mark.slow]

BOT = "bot"
HEADER = "x-chatfleet-track"
CHUNKS = 5


@dataclass
class Seen:
    """One request a backend received."""

    method: str
    path: str
    request_id: str
    body: bytes
    at: float


@dataclass
class Backend:
    """A recording HTTP server: answers {"backend": name}; GET /stream answers CHUNKS chunks in turn."""

    name: str
    address: str
    seen: list[Seen] = field(default_factory=list)
    #: per request id: one Event per chunk, set by the client once it has read that chunk
    read: dict[str, list[threading.Event]] = field(default_factory=dict)
    #: per request id: whether each chunk was read before the next was written, and the time just before
    #: the stream's end was written (no copy can leave Traefik before it has that end)
    streamed: dict[str, tuple[list[bool], float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _record(self) -> str:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                rid = self.headers.get("x-request-id", "")
                backend.seen.append(Seen(self.command, self.path, rid, body, time.monotonic()))
                return rid

            def _answer(self) -> None:
                out = json.dumps({"backend": backend.name}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_POST(self) -> None:
                self._record()
                self._answer()

            def do_GET(self) -> None:
                rid = self._record()
                if self.path != "/stream" or backend.name != "stable":
                    return self._answer()
                events = backend.read.setdefault(rid, [threading.Event() for _ in range(CHUNKS)])
                live: list[bool] = []
                ending = 0.0
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for i in range(CHUNKS):
                        data = chunk(i)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        live.append(events[i].wait(3))  # the client has read chunk i: nothing buffers
                    ending = time.monotonic()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:  # the client hung up and Traefik closed this connection
                    self.close_connection = True
                backend.streamed[rid] = (live, ending or time.monotonic())

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((self.address, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def ids(self, prefix: str) -> list[str]:
        """Request ids seen that start with `prefix`, in arrival order."""
        return [s.request_id for s in list(self.seen) if s.request_id.startswith(prefix)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def chunk(i: int) -> bytes:
    return f'data: {{"chunk": {i}}}\n\n'.encode()


@pytest.fixture(scope="module")
def backends() -> Iterator[dict[str, Backend]]:
    """stable (chat port), canary (chat port) and shadow (the canary's shadow port) on a host address."""
    from needs import missing

    host = hostbackends.HostAddress()
    try:
        host.open()
    except PlatformError as exc:
        missing("a host address for the backends", str(exc))
    started = {name: Backend(name, host.address) for name in ("stable", "canary", "shadow")}
    try:
        yield started
    finally:
        for b in started.values():
            b.stop()
        host.close()


def services(ns: str, backends: dict[str, Backend]) -> list[dict]:
    """Services bot (8080), bot-canary (8080), bot-shadow (8081), each with an EndpointSlice to its server."""
    out = []
    for service, backend, port, port_name in (
        (BOT, "stable", 8080, "http"),
        (f"{BOT}-canary", "canary", 8080, "http"),
        (f"{BOT}-shadow", "shadow", 8081, "shadow"),
    ):
        b = backends[backend]
        out.append(hostbackends.selectorless_service(service, ns, port, port_name))
        out.append(hostbackends.endpoint_slice(service, ns, b.address, b.port, port_name))
    return out


def mirror(ns: str, percent: int) -> dict:
    """TraefikService bot-mirror: all to bot:8080, `percent` % also to bot-shadow:8081."""
    return traefikcrd.mirroring_service(
        f"{BOT}-mirror", ns, main=(BOT, 8080), mirrors=[(f"{BOT}-shadow", 8081, percent)]
    )


def route(ns: str, gateway, host: str, *, weighted: dict | None = None) -> dict:
    """HTTPRoute bot for `host`: the header rule to bot-canary, then the weighted rule (default: the mirror)."""
    weighted = weighted or {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [traefikcrd.traefik_service_ref(f"{BOT}-mirror")],
    }
    header_rule = {
        "matches": [{"headers": [{"name": HEADER, "value": "canary"}]}],
        "backendRefs": [{"name": f"{BOT}-canary", "port": 8080}],
    }
    return gateway.route(BOT, ns, host, [header_rule, weighted])


def ask(gateway, host: str, rid: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """POST a chat-like body for `host`: (status, the answering backend's name or the body's start)."""
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body_of(rid),
            headers={
                "Host": host,
                "Content-Type": "application/json",
                "x-request-id": rid,
                **(headers or {}),
            },
        )
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
    except (http.client.HTTPException, OSError) as exc:
        return 0, type(exc).__name__
    finally:
        conn.close()
    if resp.status != 200:
        return resp.status, text[:120]
    return 200, json.loads(text).get("backend", "?")


def body_of(rid: str) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": f"hello {rid}"}], "stream": False}).encode()


def route_status(cluster, ns: str, gateway) -> dict[str, str]:
    """The route's conditions for the shared Gateway, type -> status ({} before Traefik wrote any)."""
    res = cluster.kubectl("get", "httproute", BOT, "-o", "json", namespace=ns, check=False)
    if res.returncode != 0:
        return {}
    for parent in json.loads(res.stdout).get("status", {}).get("parents", []):
        if parent["parentRef"]["name"] == gateway.name:
            return {c["type"]: c["status"] for c in parent.get("conditions", [])}
    return {}


def mirroring_in_effect(gateway, host: str, shadow: Backend, prefix: str) -> bool:
    """One request answered by stable, and a copy of some request of `prefix` reached the shadow.

    Traefik applies each changed object on its own (its provider throttle is 2 s): stable may answer
    while the mirror still points at an older shadow address, so only a copy seen proves the path.
    """
    rid = f"{prefix}{uuid.uuid4().hex[:6]}"
    if ask(gateway, host, rid) != (200, "stable"):
        return False
    return wait_until(lambda: bool(shadow.ids(prefix)), 1, 0.1)


def set_up(cluster, gateway, backends, ns: str, percent: int) -> str:
    """Services, the TraefikService, then the route (in that order: a route to a TraefikService that does
    not exist yet answers 404); waits until a copy reached the shadow. Returns the route's hostname."""
    host = f"{ns}.mirror.chatfleet.test"
    cluster.apply(services(ns, backends))
    cluster.apply([mirror(ns, percent)])
    cluster.apply([route(ns, gateway, host)])
    assert wait_until(lambda: route_status(cluster, ns, gateway).get("Accepted") == "True", 30, 0.5), (
        cluster.kubectl("get", "httproute", BOT, "-o", "yaml", namespace=ns).stdout
    )
    ok = wait_until(lambda: mirroring_in_effect(gateway, host, backends["shadow"], f"{ns}-warm-"), 40, 0.2)
    assert ok, f"{ask(gateway, host, 'probe')}; Traefik log:\n{gateway.log.read_text()[-3000:]}"
    return host


def test_traefik_service_mirrors_a_share_while_the_main_service_answers_all(
    cluster, gateway, backends, namespace
):
    ns = namespace
    t0 = time.monotonic()
    host = set_up(cluster, gateway, backends, ns, percent=25)
    ready_s = time.monotonic() - t0

    batch = [f"{ns}-req-{i:02d}" for i in range(40)]
    answers = [ask(gateway, host, rid) for rid in batch]
    assert answers == [(200, "stable")] * 40, answers
    assert backends["stable"].ids(f"{ns}-req-") == batch
    # the copies go out after each answer, from Traefik's goroutine pool: let them land
    wait_until(lambda: len(backends["shadow"].ids(f"{ns}-req-")) >= 10, 10, 0.2)
    time.sleep(0.5)
    copies = backends["shadow"].ids(f"{ns}-req-")
    assert set(copies) <= set(batch) and len(copies) == len(set(copies)), copies
    assert 8 <= len(copies) <= 12, f"25 % of 40 requests mirrored: {len(copies)} ({copies})"
    bodies = {s.request_id: s.body for s in backends["shadow"].seen if s.request_id in copies}
    assert all(bodies[rid] == body_of(rid) for rid in copies), "a copy's body differs from the request's"

    pinned = [ask(gateway, host, f"{ns}-hdr-{i}", {HEADER: "canary"}) for i in range(6)]
    assert pinned == [(200, "canary")] * 6, pinned
    time.sleep(0.5)
    assert backends["shadow"].ids(f"{ns}-hdr-") == [], "the header rule goes to a plain Service: no copies"
    assert route_status(cluster, ns, gateway) == {"Accepted": "True", "ResolvedRefs": "True"}
    print(f"mirroring in effect {ready_s:.1f}s after the apply; copies of 40 at 25 %: {len(copies)}")


def test_a_streamed_answer_arrives_whole_and_live_and_is_mirrored_after_it_ends(
    cluster, gateway, backends, namespace
):
    ns = namespace
    host = set_up(cluster, gateway, backends, ns, percent=100)
    stable, shadow = backends["stable"], backends["shadow"]

    rid = f"{ns}-stream"
    events = stable.read.setdefault(rid, [threading.Event() for _ in range(CHUNKS)])
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=15)
    try:
        conn.request("GET", "/stream", headers={"Host": host, "x-request-id": rid})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        got, n = b"", 0
        while piece := resp.read1(65536):
            got += piece
            while n < CHUNKS and got.startswith(b"".join(chunk(i) for i in range(n + 1))):
                events[n].set()  # tell the backend chunk n arrived; it writes the next one only then
                n += 1
    finally:
        conn.close()
    assert got == b"".join(chunk(i) for i in range(CHUNKS)), got
    # the backend records the stream once its last write returns, which can be after the client has read it
    assert wait_until(lambda: rid in stable.streamed, 5, 0.05), "the backend never finished the stream"
    live, ending = stable.streamed[rid]
    assert live == [True] * CHUNKS, f"chunks held back by Traefik with a mirror in the path: {live}"

    assert wait_until(lambda: shadow.ids(rid), 10, 0.1), "the streamed request was never mirrored"
    (copy,) = [s for s in shadow.seen if s.request_id == rid]
    assert copy.method == "GET" and copy.path == "/stream"
    assert copy.at >= ending, "Traefik sends the copy once the main answer has ended"
    print(f"copy of the streamed request reached the shadow {copy.at - ending:.3f}s after the stream's end")

    # a client that hangs up after the first chunk: Traefik cancels the main request and sends no copy
    gone = f"{ns}-gone"
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=15)
    try:
        conn.request("GET", "/stream", headers={"Host": host, "x-request-id": gone})
        resp = conn.getresponse()
        assert resp.read1(65536).startswith(chunk(0))
    finally:
        conn.close()
    assert wait_until(lambda: gone in stable.streamed, 20, 0.1), "the main stream never ended"
    assert stable.streamed[gone][0][0] is False
    time.sleep(2)
    assert shadow.ids(gone) == [], "a request whose client hung up mid-stream was mirrored"


def test_a_shadow_service_without_ready_endpoints_costs_nothing(cluster, gateway, backends, namespace):
    """With allowEmptyServices (the platform's flag; docs/releases.md asks it of a Traefik that mirrors),
    a mirror with no server leaves the main Service answering every request."""
    ns = namespace
    host = set_up(cluster, gateway, backends, ns, percent=100)
    cluster.kubectl("delete", "endpointslice", f"{BOT}-shadow-host", namespace=ns)
    time.sleep(3)  # Traefik applies the EndpointSlice's removal within about 2 s
    answers = [ask(gateway, host, f"{ns}-empty-{i}") for i in range(10)]
    assert answers == [(200, "stable")] * 10, answers
    assert route_status(cluster, ns, gateway) == {"Accepted": "True", "ResolvedRefs": "True"}
    pinned = ask(gateway, host, f"{ns}-empty-hdr", {HEADER: "canary"})
    assert pinned == (200, "canary"), "the header rule (a plain Service) is not affected"


def test_the_request_mirror_filter_answers_500_with_a_clean_status(cluster, gateway, backends, namespace):
    """Traefik 3.6 lacks HTTPRoute's RequestMirror filter: the rule that has it answers 500 to everything."""
    ns = namespace
    host = f"{ns}.mirror.chatfleet.test"
    cluster.apply(services(ns, backends))
    weighted = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "filters": [
            {
                "type": "RequestMirror",
                "requestMirror": {"backendRef": {"name": f"{BOT}-shadow", "port": 8081}, "percent": 25},
            }
        ],
        "backendRefs": [{"name": BOT, "port": 8080, "weight": 100}],
    }
    cluster.apply([route(ns, gateway, host, weighted=weighted)])
    # the header rule works, so the route is in Traefik's configuration
    assert wait_until(lambda: ask(gateway, host, f"{ns}-hdr", {HEADER: "canary"}) == (200, "canary"), 30, 0.3)
    answers = [ask(gateway, host, f"{ns}-rm-{i}") for i in range(4)]
    assert [status for status, _ in answers] == [500] * 4, answers
    assert route_status(cluster, ns, gateway) == {"Accepted": "True", "ResolvedRefs": "True"}
    assert backends["stable"].ids(f"{ns}-rm-") == [] and backends["shadow"].ids(f"{ns}-rm-") == []
    assert "unsupported filter RequestMirror" in gateway.log.read_text()
