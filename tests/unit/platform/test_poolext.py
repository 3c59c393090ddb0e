"""The local platform's InferencePool extension of Envoy Gateway (chatfleet_platform.addons.poolext): what it
does to Envoy Gateway's translation for the operator's HTTPRoute over InferencePools, and which rules it
reads as pool rules."""

from __future__ import annotations

import json

import envoy_data_plane.envoy.extensions.filters.http.router.v3  # noqa: F401 - registers the Router type
import pytest
from chatfleet_operator.builders.httproute import build_httproute
from chatfleet_operator.builders.inferencepool import build_inference_pool, picker_name
from chatfleet_operator.spec import ObjectRef
from chatfleet_platform.addons.envoygateway import config, route_served
from chatfleet_platform.addons.poolext import (
    EXT_PROC,
    HCM_TYPE,
    ROUTER_TYPE,
    PoolBackend,
    PoolExtension,
    PostTranslateModifyRequest,
    PostTranslateModifyResponse,
    parents_of,
    picker_host,
    pool_status,
    program,
    rule_of,
    rules_from,
)
from chatfleet_platform.addons.poolgateway import DESTINATION_HEADER, UPSTREAM_HEADER
from envoy_data_plane.envoy.config.cluster.v3 import Cluster
from envoy_data_plane.envoy.config.listener.v3 import Listener
from envoy_data_plane.envoy.config.route.v3 import RouteConfiguration

pytestmark = pytest.mark.harness
REF = ObjectRef("ns", "bot", "uid")
GROUP = "inference.networking.k8s.io"


def translation() -> PostTranslateModifyRequest:
    """What Envoy Gateway hands the hook for Gateway ns/gw with two HTTPRoutes: bot (rule 0 a pinned
    revision, rule 1 the weighted pools) and web (over a Service); plus the proxy's readiness listener."""
    hcm = {
        "@type": HCM_TYPE,
        "statPrefix": "http-8080",
        "rds": {"routeConfigName": "ns/gw/http", "configSource": {"ads": {}, "resourceApiVersion": "V3"}},
        "httpFilters": [{"name": "envoy.filters.http.router", "typedConfig": {"@type": ROUTER_TYPE}}],
    }
    routes = [
        ("httproute/ns/bot/rule/0/match/0/*", "httproute/ns/bot/rule/0"),
        ("httproute/ns/bot/rule/1/match/0/*", "httproute/ns/bot/rule/1"),
        ("httproute/ns/web/rule/0/match/0/*", "httproute/ns/web/rule/0"),
    ]
    return PostTranslateModifyRequest(
        clusters=[Cluster.from_dict({"name": c, "type": "EDS"}) for _, c in routes],
        listeners=[
            Listener.from_dict(
                {
                    "name": "ns/gw/http",
                    "address": {"socketAddress": {"address": "0.0.0.0", "portValue": 8080}},
                    "defaultFilterChain": {"filters": [{"name": "hcm", "typedConfig": hcm}]},
                }
            ),
            Listener.from_dict(
                {
                    "name": "envoy-gateway-proxy-ready-0.0.0.0-19003",
                    "address": {"socketAddress": {"address": "0.0.0.0", "portValue": 19003}},
                }
            ),
        ],
        routes=[
            RouteConfiguration.from_dict(
                {
                    "name": "ns/gw/http",
                    "virtualHosts": [
                        {
                            "name": "gw",
                            "domains": ["*"],
                            "routes": [
                                {"name": n, "match": {"prefix": "/"}, "route": {"cluster": c}}
                                for n, c in routes
                            ],
                        }
                    ],
                }
            )
        ],
    )


STABLE = PoolBackend("ns", "bot", 80, "10.96.0.7", 9002)
CANARY = PoolBackend("ns", "bot-canary", 20, "10.96.0.7", 9003)
RULES = {
    ("ns", "bot", 0): [PoolBackend("ns", "bot", 1, "10.96.0.7", 9002)],
    ("ns", "bot", 1): [STABLE, CANARY],
}


def programmed(**kw) -> tuple[dict, list[PoolBackend]]:
    """program() over the wire and back, as Envoy Gateway sends and reads it; the response as a dict."""
    request = PostTranslateModifyRequest.parse(bytes(translation()))
    response, pools = program(request, RULES, **kw)
    return PostTranslateModifyResponse.parse(bytes(response)).to_dict(), pools


def routes_of(doc: dict) -> dict[str, dict]:
    return {r["name"]: r for r in doc["routes"][0]["virtualHosts"][0]["routes"]}


def test_the_weighted_pool_rule_becomes_a_weighted_cluster_per_pool_each_asking_its_own_picker():
    doc, pools = programmed()
    action = routes_of(doc)["httproute/ns/bot/rule/1/match/0/*"]["route"]
    assert "cluster" not in action  # Envoy Gateway's one endpoint-less cluster of the rule is not used
    weighted = action["weightedClusters"]["clusters"]
    assert [(c["name"], c["weight"]) for c in weighted] == [
        ("inferencepool/ns/bot", 80),
        ("inferencepool/ns/bot-canary", 20),
    ]
    pickers = [c["typedPerFilterConfig"][EXT_PROC]["overrides"]["grpcService"]["envoyGrpc"] for c in weighted]
    assert pickers == [
        {"clusterName": "inferencepool/ns/bot/picker"},
        {"clusterName": "inferencepool/ns/bot-canary/picker"},
    ]
    assert {p.name for p in pools} == {"bot", "bot-canary"}


def test_a_pinned_rules_one_pool_and_the_clusters_each_pool_needs():
    doc, _ = programmed()
    pinned = routes_of(doc)["httproute/ns/bot/rule/0/match/0/*"]["route"]["weightedClusters"]["clusters"]
    assert [c["name"] for c in pinned] == ["inferencepool/ns/bot"]
    clusters = {c["name"]: c for c in doc["clusters"]}
    pool = clusters["inferencepool/ns/bot-canary"]
    assert pool["type"] == "ORIGINAL_DST" and pool["lbPolicy"] == "CLUSTER_PROVIDED"
    assert pool["originalDstLbConfig"] == {"useHttpHeader": True, "httpHeaderName": DESTINATION_HEADER}
    picker = clusters["inferencepool/ns/bot-canary/picker"]
    endpoint = picker["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]["address"]
    assert endpoint["socketAddress"] == {"address": "10.96.0.7", "portValue": 9003}
    assert picker["type"] == "STATIC"
    assert (
        sum(name.startswith("inferencepool/") for name in clusters) == 4
    )  # each once, though bot is in two rules
    assert "httproute/ns/web/rule/0" in clusters  # Envoy Gateway's own clusters stay


def test_ext_proc_goes_before_the_router_once_and_other_routes_of_the_listener_turn_it_off():
    doc, _ = programmed()
    hcm = doc["listeners"][0]["defaultFilterChain"]["filters"][0]["typedConfig"]
    assert [f["name"] for f in hcm["httpFilters"]] == [EXT_PROC, "envoy.filters.http.router"]
    ext_proc = hcm["httpFilters"][0]["typedConfig"]
    assert ext_proc["processingMode"]["requestBodyMode"] == "BUFFERED" and ext_proc["allowModeOverride"]
    assert "failureModeAllow" not in ext_proc  # fail-closed, as the operator's pools ask
    web = routes_of(doc)["httproute/ns/web/rule/0/match/0/*"]
    assert web["route"] == {"cluster": "httproute/ns/web/rule/0"}
    assert web["typedPerFilterConfig"][EXT_PROC]["disabled"] is True
    # a second translation of an already programmed listener adds no second filter
    once, _ = program(PostTranslateModifyRequest.parse(bytes(translation())), RULES)
    fields = {k: getattr(once, k) for k in ("clusters", "secrets", "listeners", "routes")}
    again, _ = program(PostTranslateModifyRequest(**fields), RULES)
    filters = again.listeners[0].default_filter_chain.filters[0].typed_config.unpack().http_filters
    assert [f.name for f in filters] == [EXT_PROC, "envoy.filters.http.router"]


def test_listeners_on_every_interface_move_to_the_address_given_and_only_then():
    doc, _ = programmed()
    assert {ln["address"]["socketAddress"]["address"] for ln in doc["listeners"]} == {"0.0.0.0"}
    doc, _ = programmed(listen_on="127.0.0.1")
    assert {ln["address"]["socketAddress"]["address"] for ln in doc["listeners"]} == {"127.0.0.1"}


def test_the_replica_is_named_in_a_response_header_only_when_asked():
    assert "responseHeadersToAdd" not in routes_of(programmed()[0])["httproute/ns/bot/rule/1/match/0/*"]
    route = routes_of(programmed(identify_upstream=True)[0])["httproute/ns/bot/rule/1/match/0/*"]
    assert route["responseHeadersToAdd"] == [{"header": {"key": UPSTREAM_HEADER, "value": "%UPSTREAM_HOST%"}}]


def test_a_translation_without_pool_rules_comes_back_unchanged():
    request = translation()
    response, pools = program(request, {})
    assert pools == []
    assert bytes(response) == bytes(
        PostTranslateModifyResponse(
            **{k: getattr(request, k) for k in ("clusters", "secrets", "listeners", "routes")}
        )
    )


def cluster_objects(route: dict) -> list[dict]:
    pools = [build_inference_pool(REF, t) for t in ("stable", "canary")]
    svc = {
        "kind": "Service",
        "metadata": {"name": picker_name(REF), "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.7"},
    }
    return [route, *pools, svc]


def test_the_operators_route_read_as_pool_rules_with_each_pools_picker_port():
    route = build_httproute(
        REF, stable_weight=80, canary_weight=20, gateway_name="gw", pool_group=GROUP, pins={"a1": "stable"}
    )
    rules = rules_from(cluster_objects(route), [("ns", "bot", 0), ("ns", "bot", 1)])
    assert rules == {
        ("ns", "bot", 0): [PoolBackend("ns", "bot", 1, "10.96.0.7", 9002)],
        ("ns", "bot", 1): [STABLE, CANARY],
    }


def test_rules_over_services_or_with_a_pool_or_picker_missing_are_not_pool_rules():
    services = build_httproute(REF, stable_weight=80, canary_weight=20, gateway_name="gw")
    assert rules_from(cluster_objects(services), [("ns", "bot", 0)]) == {}
    pools = build_httproute(REF, stable_weight=80, canary_weight=20, gateway_name="gw", pool_group=GROUP)
    objects = cluster_objects(pools)
    assert rules_from(objects[:2] + objects[3:], [("ns", "bot", 0)]) == {}  # the canary pool not written yet
    assert rules_from(objects[:3], [("ns", "bot", 0)]) == {}  # its picker's Service not written yet
    assert rules_from(objects, [("ns", "bot", 5), ("ns", "other", 0)]) == {}


def test_where_a_picker_service_answers():
    assert picker_host({"clusterIP": "10.96.0.7"}) == "10.96.0.7"
    assert picker_host({"clusterIP": "None"}) is None  # headless: no one address
    assert picker_host({}) is None
    assert picker_host({"type": "ExternalName", "externalName": "127.0.0.1"}) == "127.0.0.1"


def test_rule_clusters_and_parents():
    assert rule_of("httproute/ns/bot/rule/1") == ("ns", "bot", 1)
    assert rule_of("httproute/ns/bot/rule/1/backend/0") == ("ns", "bot", 1)
    assert rule_of("grpcroute/ns/bot/rule/1") is None
    route = {
        "metadata": {"namespace": "ns"},
        "spec": {"parentRefs": [{"name": "gw"}, {"name": "e", "namespace": "edge"}]},
    }
    assert parents_of(route) == [("ns", "gw"), ("edge", "e")]
    status = pool_status([("ns", "gw")], 3, "2026-12-05T00:00:00Z")
    (entry,) = status["parents"]
    assert entry["parentRef"] == {
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
        "namespace": "ns",
        "name": "gw",
    }
    assert {(c["type"], c["status"], c["observedGeneration"]) for c in entry["conditions"]} == {
        ("Accepted", "True", 3),
        ("ResolvedRefs", "True", 3),
    }


def test_envoy_gateway_hands_inference_pools_to_the_extensions_post_translate_hook():
    doc = config(__import__("pathlib").Path("/w"), 4321)
    ext = doc["extensionManager"]
    assert ext["backendResources"] == [{"group": GROUP, "version": "v1", "kind": "InferencePool"}]
    assert ext["hooks"]["xdsTranslator"]["post"] == ["Translation"]
    assert ext["hooks"]["xdsTranslator"]["translation"] == {
        "listener": {"includeAll": True},
        "route": {"includeAll": True},
    }
    assert ext["service"] == {"ip": {"address": "127.0.0.1", "port": 4321}}
    assert doc["provider"]["custom"]["resource"]["type"] == "Kubernetes"
    assert doc["provider"]["custom"]["infrastructure"]["type"] == "Host"


class FakeApi:
    """The extension's API side: the namespaces' objects listed, pool status writes recorded."""

    def __init__(self, objects):
        self.items, self.asked, self.writes = objects, [], []

    def objects(self, namespaces):
        self.asked.append(sorted(set(namespaces)))
        return self.items

    def write_pool_status(self, namespace, name, status):
        self.writes.append((namespace, name, status))


def test_a_translation_reads_the_namespace_once_writes_each_pools_status_once_per_generation(tmp_path):
    route = build_httproute(REF, stable_weight=80, canary_weight=20, gateway_name="gw", pool_group=GROUP)
    objects = [{**o, "metadata": {**o["metadata"], "namespace": "ns"}} for o in cluster_objects(route)]
    api = FakeApi(objects)
    log = tmp_path / "programs.jsonl"
    extension = PoolExtension(api, programs_log=log)
    request = PostTranslateModifyRequest.parse(bytes(translation()))
    extension.translate(request)
    extension.translate(PostTranslateModifyRequest.parse(bytes(translation())))
    assert api.asked == [["ns"], ["ns"]]  # one read of the namespace a translation
    assert [(ns, name) for ns, name, _ in api.writes] == [("ns", "bot"), ("ns", "bot-canary")]  # once each
    (entry,) = api.writes[0][2]["parents"]
    assert entry["parentRef"]["name"] == "gw" and entry["parentRef"]["namespace"] == "ns"
    assert [json.loads(line)["weights"] for line in log.read_text().splitlines()] == [
        {"bot": 80, "bot-canary": 20},
        {"bot": 80, "bot-canary": 20},
    ]
    objects[1]["metadata"]["generation"] = 2  # the stable pool changed: its status is written again
    extension.translate(PostTranslateModifyRequest.parse(bytes(translation())))
    assert [(ns, name) for ns, name, _ in api.writes][2:] == [("ns", "bot")]


def test_envoy_serves_a_route_when_each_pool_rule_has_its_pools_weights():
    route = build_httproute(
        REF, stable_weight=80, canary_weight=20, gateway_name="gw", pool_group=GROUP, pins={"a1": "stable"}
    )

    def dump(weights):
        routes = [
            {"name": "httproute/ns/bot/rule/0/match/0/*", "route": {"weighted_clusters": {"clusters": [
                {"name": "inferencepool/ns/bot", "weight": 1}]}}},
            {"name": "httproute/ns/bot/rule/1/match/0/*", "route": {"weighted_clusters": {"clusters": [
                {"name": "inferencepool/ns/bot", "weight": weights[0]},
                {"name": "inferencepool/ns/bot-canary", "weight": weights[1]}]}}},
            {"name": "httproute/ns/web/rule/0/match/0/*", "route": {"cluster": "httproute/ns/web/rule/0"}},
        ]  # fmt: skip
        return {"configs": [{"route_config": {"virtual_hosts": [{"routes": routes}]}}]}

    assert route_served(route, dump((80, 20)))
    assert not route_served(route, dump((50, 50)))  # the weights before the change
    assert not route_served(route, {})  # Envoy without the route yet
    services = build_httproute(REF, stable_weight=80, canary_weight=20, gateway_name="gw")
    assert route_served(services, {})  # no pool rule to wait for
