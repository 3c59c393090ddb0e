"""The endpoint picker of one ChatbotService: Envoy's external processor (ext_proc) for its InferencePools.

The Gateway API Inference Extension's contract: the gateway sends each request of an InferencePool to the
pool's endpoint picker over ext_proc; the picker answers with the header
`x-gateway-destination-endpoint: <ip:port>` and the gateway sends the request there. One picker serves
both pools of a ChatbotService (stable and canary), one gRPC port each, so it knows which pool the route's
weights chose without anything gateway-specific, and one dialogue table spans both (chatfleet_picker.choose).
With `--route` it also reads the HTTPRoute's weights (a watch, in its namespace), so new dialogues take the
tracks in exactly those shares rather than by the gateway's per-request draw.

Who calls it: the gateway's data plane only (the pools' endpointPickerRef names these ports); its metrics
port is for Prometheus. The dialogue key is read as the chat API reads it: header X-Session-Id, else the
JSON body's session_id, else its user. With the header the picker answers at the request's headers and
asks the gateway (ext_proc's mode override, where the gateway allows it) not to send the body: one
message each way per request. Without it the body is buffered for the key and passed on unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence

import grpclib.server
from envoy_data_plane.envoy.config.core.v3 import HeaderValue, HeaderValueOption
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    BodyResponse,
    CommonResponse,
    ExternalProcessorBase,
    HeaderMutation,
    HeadersResponse,
    ProcessingRequest,
    ProcessingResponse,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from chatfleet_picker.choose import Endpoint, Limits, Picker
from chatfleet_picker.fleet import Fleet, LatestRoute, Replica, scrape, watch_pods, watch_route

log = logging.getLogger("chatfleet.picker")

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SESSION_HEADER = "x-session-id"
#: Picker ports of the pools, by track (the operator's InferencePools name them).
DEFAULT_PORTS = {"stable": 9002, "canary": 9003}
#: The rest of a request the picker answered at its headers: nothing more of it (a mode override replaces
#: the whole mode, so the response's headers are skipped here as the gateway's own mode skips them).
HEADERS_ONLY = ProcessingMode(
    request_header_mode=ProcessingModeHeaderSendMode.SEND,
    response_header_mode=ProcessingModeHeaderSendMode.SKIP,
    request_body_mode=ProcessingModeBodySendMode.NONE,
    response_body_mode=ProcessingModeBodySendMode.NONE,
    request_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
    response_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
)


def dialogue_key(headers: Mapping[str, str], body: bytes) -> str | None:
    """The dialogue a request belongs to, as the chat API finds it (None: none given).

    >>> dialogue_key({"x-session-id": "s1"}, b'{"user": "u"}')
    's1'
    >>> dialogue_key({}, b'{"user": "ann@example.com", "messages": []}')
    'user:ann@example.com'
    >>> dialogue_key({}, b'not json') is None
    True
    """
    if headers.get(SESSION_HEADER):
        return headers[SESSION_HEADER]
    try:
        doc = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("session_id"), str) and doc["session_id"]:
        return doc["session_id"]
    if isinstance(doc.get("user"), str) and doc["user"]:
        return "user:" + doc["user"]
    return None


def _headers(message) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in (message.headers.headers if message.headers else []) or []:
        out[h.key.lower()] = h.value or h.raw_value.decode("utf-8", "replace")
    return out


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.picks = Counter(
            "chatfleet_picker_picks",
            "Requests routed, by the pool the route chose and why",
            ["pool", "reason"],
            registry=registry,
        )
        self.unavailable = Counter(
            "chatfleet_picker_no_endpoint",
            "Requests with no ready replica to send to",
            ["pool"],
            registry=registry,
        )
        self.dialogues = Gauge("chatfleet_picker_dialogues", "Dialogues remembered", registry=registry)


class PoolProcessor(ExternalProcessorBase):
    """ext_proc for the pool of one track. The picker is used on the event loop only (these handlers and
    the metrics reads' `observe`), so it needs no lock; the pod watch's thread touches the Fleet only."""

    def __init__(self, track: str, fleet: Fleet, picker: Picker, metrics: Metrics, route: LatestRoute):
        self.track, self.fleet, self.picker, self.metrics = track, fleet, picker, metrics
        self.route = route

    def choose(self, headers: Mapping[str, str], body: bytes) -> CommonResponse:
        dialogue = dialogue_key(headers, body)
        route = self.route.current
        self.picker.set_weights(route.weights if route else None)
        # a request that a pinning rule sent to this pool keeps it; the weights decide the others
        by_weight = route is None or not route.pinned(headers)
        choice = self.picker.pick(dialogue, self.track, self.fleet.endpoints(), by_weight=by_weight)
        self.metrics.dialogues.set(len(self.picker))
        if choice is None:
            self.metrics.unavailable.labels(self.track).inc()
            return CommonResponse()
        self.metrics.picks.labels(self.track, choice.reason).inc()
        value = HeaderValue(key=DESTINATION_HEADER, raw_value=choice.address.encode())
        return CommonResponse(header_mutation=HeaderMutation(set_headers=[HeaderValueOption(header=value)]))

    async def process(self, messages: AsyncIterator[ProcessingRequest]) -> AsyncIterator[ProcessingResponse]:
        headers: dict[str, str] = {}
        body = b""
        chosen = False
        async for message in messages:
            if message.request_headers is not None:
                headers = _headers(message.request_headers)
                last = message.request_headers.end_of_stream
                if last or headers.get(SESSION_HEADER):  # no body, or the dialogue named: decide now
                    chosen = True
                    answer = ProcessingResponse(
                        request_headers=HeadersResponse(response=self.choose(headers, b""))
                    )
                    if not last:
                        answer.mode_override = HEADERS_ONLY
                    yield answer
                else:
                    yield ProcessingResponse(request_headers=HeadersResponse(response=CommonResponse()))
            elif message.request_body is not None:
                if chosen:  # a gateway that does not allow mode overrides sends the body anyway
                    yield ProcessingResponse(request_body=BodyResponse(response=CommonResponse()))
                    continue
                body += message.request_body.body
                if message.request_body.end_of_stream:
                    yield ProcessingResponse(request_body=BodyResponse(response=self.choose(headers, body)))
                else:
                    yield ProcessingResponse(request_body=BodyResponse(response=CommonResponse()))
            elif message.response_headers is not None:
                yield ProcessingResponse(response_headers=HeadersResponse(response=CommonResponse()))


def static_fleet(specs: Sequence[str]) -> Fleet:
    """Replicas given on the command line (no Kubernetes): 'address,track,revision[,metrics_url]'."""
    replicas = []
    for spec in specs:
        parts = spec.split(",")
        if len(parts) not in (3, 4):
            raise ValueError(f"--endpoint {spec!r}: expected address,track,revision[,metrics_url]")
        address, track, revision = parts[:3]
        url = parts[3] if len(parts) == 4 else f"http://{address}/metrics"
        replicas.append(Replica(Endpoint(address, revision, track), url))
    return Fleet(replicas)


async def serve(
    fleet: Fleet,
    ports: Mapping[str, int],
    host: str,
    limits: Limits,
    scrape_interval_s: float,
    metrics: Metrics,
    route: LatestRoute,
) -> None:
    picker = Picker(limits, clock=time.monotonic)
    servers = []
    for track, port in ports.items():
        server = grpclib.server.Server([PoolProcessor(track, fleet, picker, metrics, route)])
        await server.start(host, port)
        servers.append(server)
        log.info("picker for the %s pool on %s:%d", track, host, port)
    try:
        await scrape(fleet, picker.observe, scrape_interval_s)
    finally:
        for server in servers:
            server.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chatfleet_picker", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--host", default="0.0.0.0", help="address the gRPC ports bind (127.0.0.1 off-cluster)"
    )
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="TRACK=PORT",
        help="a pool's track and its gRPC port (default stable=9002 canary=9003)",
    )
    parser.add_argument("--namespace", help="watch the pods of this namespace (with --selector)")
    parser.add_argument("--selector", help="label selector of the ChatbotService's pods")
    parser.add_argument("--target-port", type=int, default=8080, help="the pods' chat port")
    parser.add_argument("--pod-metrics-port", type=int, default=8090, help="the pods' metrics port")
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        help="a replica without Kubernetes: address,track,revision[,metrics_url]",
    )
    parser.add_argument(
        "--route",
        help="the HTTPRoute (in --namespace) whose weights new dialogues follow exactly (with --pool-name)",
    )
    parser.add_argument(
        "--pool-name",
        action="append",
        default=[],
        metavar="TRACK=POOL",
        help="the InferencePool of a track in --route, e.g. canary=bot-canary",
    )
    parser.add_argument("--metrics-port", type=int, default=0, help="the picker's own /metrics (0: none)")
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--max-queue", type=float, default=Limits.max_queue)
    parser.add_argument(
        "--max-dialogues", type=int, default=Limits.sessions, help="dialogues remembered (LRU)"
    )
    parser.add_argument(
        "--dialogue-ttl", type=float, default=Limits.session_ttl_s, help="seconds an idle dialogue is kept"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # Envoy resets each ext_proc stream once it needs nothing more of it: grpclib logs that at INFO.
    logging.getLogger("grpclib.server").setLevel(logging.WARNING)
    try:
        ports = dict((t, int(p)) for t, p in (x.split("=", 1) for x in args.pool)) or dict(DEFAULT_PORTS)
    except ValueError:
        parser.error("--pool: expected TRACK=PORT, e.g. stable=9002")
    if args.endpoint:
        fleet = static_fleet(args.endpoint)
    elif args.namespace and args.selector:
        fleet = Fleet()
        threading.Thread(
            target=watch_pods,
            args=(fleet, args.namespace, args.selector, args.target_port, args.pod_metrics_port),
            daemon=True,
        ).start()
    else:
        parser.error("give --namespace and --selector (pods from the API) or --endpoint (a fixed list)")
    route = LatestRoute()
    if args.route:
        if not (args.namespace and args.pool_name):
            parser.error("--route needs --namespace and --pool-name TRACK=POOL")
        pools = {pool: track for track, pool in (x.split("=", 1) for x in args.pool_name)}
        threading.Thread(
            target=watch_route, args=(route, args.namespace, args.route, pools), daemon=True
        ).start()
    registry = CollectorRegistry()
    metrics = Metrics(registry)  # counted always, served only with --metrics-port
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host, registry=registry)
    limits = Limits(
        max_queue=args.max_queue,
        sessions=args.max_dialogues,
        session_ttl_s=args.dialogue_ttl,
    )
    asyncio.run(serve(fleet, ports, args.host, limits, args.scrape_interval, metrics, route))


if __name__ == "__main__":
    main()
