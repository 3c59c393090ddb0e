"""The local platform's InferencePool gateway (chatfleet_platform.addons.poolgateway): Envoy's config from the
objects the operator writes, and the plain-Service gateway the routing benchmark compares against."""

from __future__ import annotations

from pathlib import Path

import pytest
from chatfleet_operator.builders.httproute import build_httproute
from chatfleet_operator.builders.inferencepool import PICKER_PORTS, build_inference_pool
from chatfleet_operator.spec import ObjectRef
from chatfleet_platform.addons.poolgateway import (
    DESTINATION_HEADER,
    EXT_PROC,
    POOL_CONTROLLER,
    UPSTREAM_HEADER,
    PoolRouteController,
    ServiceBackend,
    envoy_config,
    pools_of,
    service_config,
    with_route_from_file,
)
from chatfleet_platform.common.config import PlatformError

pytestmark = pytest.mark.harness
REF = ObjectRef("ns", "bot", "uid")


def hcm(config):
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def test_the_operators_route_and_pools_become_weighted_pools_asking_their_own_picker_port():
    route = build_httproute(
        REF, stable_weight=80, canary_weight=20, gateway_name="gw", pool_group="inference.networking.k8s.io"
    )
    pools = {p["metadata"]["name"]: p for p in (build_inference_pool(REF, t) for t in ("stable", "canary"))}
    found = pools_of(route, pools, "127.0.0.1")
    assert [(p.name, p.weight, p.picker_port) for p in found] == [
        ("bot", 80, PICKER_PORTS["stable"]),
        ("bot-canary", 20, PICKER_PORTS["canary"]),
    ]
    config = envoy_config(found, 10080, 10081)
    weighted = hcm(config)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["weighted_clusters"]
    per_pool = [
        c["typed_per_filter_config"][EXT_PROC]["overrides"]["grpc_service"] for c in weighted["clusters"]
    ]
    assert [g["envoy_grpc"]["cluster_name"] for g in per_pool] == ["picker-bot", "picker-bot-canary"]
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    assert clusters["pool-bot"]["original_dst_lb_config"]["http_header_name"] == DESTINATION_HEADER
    assert hcm(config)["http_filters"][0]["name"] == EXT_PROC
    # the listener stays on the loopback
    assert config["static_resources"]["listeners"][0]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_a_route_over_services_is_no_pool_route():
    route = build_httproute(REF, stable_weight=100, canary_weight=0, gateway_name="gw")
    with pytest.raises(PlatformError, match="not an InferencePool"):
        pools_of(route, {}, "127.0.0.1")


def test_the_service_gateway_balances_or_hashes_and_can_name_the_upstream():
    backends = [ServiceBackend("bot", 100, ("127.0.0.1:1", "127.0.0.1:2"))]
    plain = service_config(backends, 1, 2, lb_policy="RANDOM")
    assert plain["static_resources"]["clusters"][0]["lb_policy"] == "RANDOM"
    assert "response_headers_to_add" not in hcm(plain)["route_config"]
    hashed = service_config(backends, 1, 2, hash_header="x-session-id", identify_upstream=True)
    assert hashed["static_resources"]["clusters"][0]["lb_policy"] == "RING_HASH"
    route = hcm(hashed)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["hash_policy"] == [{"header": {"header_name": "x-session-id"}}]
    assert hcm(hashed)["route_config"]["response_headers_to_add"][0]["header"]["key"] == UPSTREAM_HEADER


def test_the_gateways_route_is_read_from_a_watched_file():
    """Envoy takes new weights as a route update (filesystem RDS), not a restart: streams go on."""
    route = build_httproute(
        REF, stable_weight=80, canary_weight=20, gateway_name="gw", pool_group="inference.networking.k8s.io"
    )
    pools = {p["metadata"]["name"]: p for p in (build_inference_pool(REF, t) for t in ("stable", "canary"))}
    config = envoy_config(pools_of(route, pools, "127.0.0.1"), 10080, 10081, identify_upstream=True)
    bootstrap, served = with_route_from_file(config, Path("/tmp/routes"))
    assert "route_config" not in hcm(bootstrap) and "route_config" in hcm(config)  # the input is kept
    source = hcm(bootstrap)["rds"]["config_source"]["path_config_source"]
    assert source == {"path": "/tmp/routes/route.yaml", "watched_directory": {"path": "/tmp/routes"}}
    assert bootstrap["node"]["id"]  # xDS needs a node
    weighted = served["virtual_hosts"][0]["routes"][0]["route"]["weighted_clusters"]["clusters"]
    assert [(c["name"], c["weight"]) for c in weighted] == [("pool-bot", 80), ("pool-bot-canary", 20)]
    assert served["response_headers_to_add"][0]["header"]["key"] == UPSTREAM_HEADER


class FakeCluster:
    """kubectl over the operator's objects: `get -o json` lists them all (the controller asks for the
    namespace's routes, pools and Services at once), `patch --subresource=status` is recorded."""

    def __init__(self, objects):
        self.objects, self.patches = objects, []

    def kubectl(self, *args, namespace=None, check=True):
        import json
        import subprocess

        if args[0] == "patch":
            self.patches.append((args[1], args[2], json.loads(args[-1])))
            return subprocess.CompletedProcess(args, 0, "", "")
        assert args[:2] == ("get", "httproutes,inferencepools,services"), args
        return subprocess.CompletedProcess(args, 0, json.dumps({"items": self.objects}), "")


class FakeGateway:
    def __init__(self):
        self.programmed = []

    def program(self, pools, identify_upstream=False):
        self.programmed.append([(p.name, p.weight, p.picker_host, p.picker_port) for p in pools])


def test_the_route_controller_programs_the_pools_at_the_pickers_cluster_ip_and_writes_their_status():
    route = build_httproute(
        REF, stable_weight=50, canary_weight=50, gateway_name="gw", gateway_namespace="edge",
        pool_group="inference.networking.k8s.io",
    )  # fmt: skip
    route["metadata"]["generation"] = 3
    picker_service = {
        "kind": "Service",
        "metadata": {"name": "bot-picker"},
        "spec": {"clusterIP": "10.96.0.9"},
    }
    objects = [route, picker_service]
    objects += [build_inference_pool(REF, track) for track in ("stable", "canary")]
    cluster, gateway = FakeCluster(objects), FakeGateway()
    controller = PoolRouteController(cluster, "ns", "bot", gateway, ("edge", "gw"))
    controller.pass_once()
    controller.pass_once()
    picker = PICKER_PORTS
    assert gateway.programmed[0] == [
        ("bot", 50, "10.96.0.9", picker["stable"]),
        ("bot-canary", 50, "10.96.0.9", picker["canary"]),
    ]
    assert [w for _, w in controller.programs] == [(("bot", 50), ("bot-canary", 50))]  # one change, once
    # each object's status written once per generation, naming the Gateway; the route's names the controller
    assert [(k, n) for k, n, _ in cluster.patches] == [
        ("httproute", "bot"), ("inferencepool", "bot"), ("inferencepool", "bot-canary")
    ]  # fmt: skip
    (entry,) = cluster.patches[0][2]["status"]["parents"]
    assert entry["parentRef"]["name"] == "gw" and entry["parentRef"]["namespace"] == "edge"
    assert entry["controllerName"] == POOL_CONTROLLER
    assert {c["type"]: (c["status"], c["observedGeneration"]) for c in entry["conditions"]} == {
        "Accepted": ("True", 3),
        "ResolvedRefs": ("True", 3),
    }
    assert "controllerName" not in cluster.patches[1][2]["status"]["parents"][0]


def test_the_route_controller_leaves_a_route_over_services_alone():
    route = build_httproute(REF, stable_weight=100, canary_weight=0, gateway_name="gw")
    cluster, gateway = FakeCluster([route]), FakeGateway()
    PoolRouteController(cluster, "ns", "bot", gateway, ("ns", "gw")).pass_once()
    assert gateway.programmed == [] and cluster.patches == []
