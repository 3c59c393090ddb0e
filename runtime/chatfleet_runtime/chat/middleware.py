"""The chat API's ASGI layer under its routes: the ports, the track headers, the drain's gate.

- ``PortRoutes``: one server listens on a socket per port (chat, admin, metrics, shadow); a request is
  routed by the port it arrived on (``arrival_port``: the ASGI scope's ``server``) to that port's routes
  only, else 404 (docs/security.md "Ports");
- ``TrackHeaders``: ``x-chatfleet-track`` and ``x-chatfleet-revision`` on every response, streams included;
- ``DrainGate``: counts chat requests in and out of the drain and says ``Connection: close`` once the drain
  settled (docs/runtime.md "Draining");
- ``loopback_only``: the guard of ``/drain``, which only the pod's own preStop hook may call.

``chatfleet_runtime.chat.api`` builds the app with them (``create_app``). Plain ASGI (not Starlette's
BaseHTTPMiddleware, which would break the streams), and nothing of the pipeline but the drain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from chatfleet_runtime.chat.drain import Drain

#: The chat requests the drain counts (in flight, arrivals) on the chat port; nothing on the admin, metrics
#: or shadow ports is work (mirrors are refused once draining and never hold a drain).
WORK_PATHS = frozenset({"/v1/chat/completions"})


class TrackHeaders:
    """ASGI middleware: adds fixed headers (track, revision) to every HTTP response, streams included.

    Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would wrap streaming responses and
    break the client-disconnect cancellation the streams rely on.
    """

    def __init__(self, app, headers: Mapping[str, str]):
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope, receive, send):
        """Pass through, adding the headers to `http.response.start`."""
        if scope["type"] != "http" or not self.headers:
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        return await self.app(scope, receive, send_with_headers)


class DrainGate:
    """ASGI middleware: counts chat requests in and out of the drain (arrival to last byte, streams
    included, a client that left included) and adds ``Connection: close`` to every response once the drain
    has settled, so the keep-alive clients still reaching this pod take their next request elsewhere.

    Not before: until the endpoint removal has reached it, the gateway still sends requests here, and
    Traefik's fast proxy puts a connection whose answer said ``Connection: close`` back in its pool; the
    next request written on it as the pod closes it is answered 502 by Traefik ("connection reset by
    peer"). A proxy that routes to endpoints needs no hint: the removal moves its new requests."""

    def __init__(self, app, drain: Drain, other_ports: frozenset[int] = frozenset()):
        self.app = app
        self.drain = drain
        self.other_ports = frozenset(p for p in other_ports if p)
        """The ports that are not the chat port (admin, metrics, shadow): nothing there is work."""

    async def __call__(self, scope, receive, send):
        """Pass through; count work requests, close connections once the drain settled."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_closing(message):
            if message["type"] == "http.response.start" and self.drain.settled():
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"connection" for k, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        if scope["path"] not in WORK_PATHS or arrival_port(scope) in self.other_ports:
            return await self.app(scope, receive, send_closing)
        self.drain.enter()
        try:
            return await self.app(scope, receive, send_closing)
        finally:
            self.drain.leave()


Handler = Callable[[Request], Awaitable[Response]]


#: Where a request to the drain may come from: the pod itself (its preStop hook), never the network.
LOOPBACK = frozenset({"127.0.0.1", "::1"})


def loopback_only(handler: Handler) -> Handler:
    """The handler for requests from this pod's own loopback (the kernel drops loopback sources arriving
    on any other interface); 403 for anyone else."""

    async def guarded(request: Request) -> Response:
        if request.client is None or request.client.host not in LOOPBACK:
            return JSONResponse({"detail": "the drain is the pod's own (loopback only)"}, status_code=403)
        return await handler(request)

    return guarded


def arrival_port(scope) -> int | None:
    """The listening port an HTTP request arrived on (the ASGI scope's ``server``), None if unknown."""
    server = scope.get("server") if scope["type"] == "http" else None
    return server[1] if server is not None else None


class PortRoutes:
    """ASGI middleware: a request that arrived on one of the given ports gets that port's routes and
    nothing else (404, whatever the method); a request on any other port (the chat port) passes on to the
    chat API's routes. Lifespan and other scopes pass through."""

    def __init__(self, app, ports: Mapping[int, Mapping[tuple[str, str], Handler]]):
        self.app = app
        self.ports = {port: routes for port, routes in ports.items() if port}
        """port -> {(method, path): handler}; port 0 (off) never matches."""

    async def __call__(self, scope, receive, send):
        """Route requests of the listed ports here; pass everything else through."""
        routes = self.ports.get(arrival_port(scope))
        if routes is None:
            return await self.app(scope, receive, send)
        route = routes.get((scope["method"], scope["path"]))
        if route is None:
            response: Response = JSONResponse({"detail": "Not Found"}, status_code=404)
        else:
            response = await route(Request(scope, receive))
        await response(scope, receive, send)
