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
    UPSTREAM_HEADER,
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
