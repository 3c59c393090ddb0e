"""The traffic router (release/router.py): a strategy's intent -> the objects that carry it.

Test design: each shape a strategy asks for, built from its intent alone (no strategy, no planner), and
read back from the manifests: the Services' selectors and affinity, the route's weights, pins and
mirror, and Traefik's TraefikService only where the gateway mirrors that way.
"""

from __future__ import annotations

from dataclasses import replace

from chatfleet_operator.builders.httproute import HeaderMatch, Mirror
from chatfleet_operator.release.router import TrafficIntent, WeightedRoute, traffic_objects
from chatfleet_operator.settings import Settings
from pass_helpers import context

SPEC = {"model": {"uri": "hf://org/m"}, "scaling": {"replicas": 2}}


def kinds(objects):
    return [(m["kind"], m["metadata"]["name"]) for m in objects]


def test_one_service_over_every_pod_with_affinity():
    objects = traffic_objects(
        context(SPEC), TrafficIntent("canary", affinity_seconds=600, track_service=False)
    )
    assert kinds(objects) == [("Service", "bot")]
    spec = objects[0]["spec"]
    assert spec["selector"] == {"chatfleet.io/service": "bot"}
    assert (spec["sessionAffinity"], spec["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"]) == (
        "ClientIP",
        600,
    )


def test_an_active_service_on_one_revision_and_the_tracks_own_service():
    intent = TrafficIntent("preview", {"chatfleet.io/revision": "r1"}, affinity_seconds=60)
    objects = traffic_objects(context(SPEC), intent)
    assert kinds(objects) == [("Service", "bot"), ("Service", "bot-preview")]
    assert objects[0]["spec"]["selector"] == {"chatfleet.io/service": "bot", "chatfleet.io/revision": "r1"}
    assert objects[1]["spec"]["selector"] == {"chatfleet.io/service": "bot", "chatfleet.io/track": "preview"}
    assert "sessionAffinity" not in objects[1]["spec"]


def test_a_weighted_route_with_pins_in_front_of_a_service_per_track():
    route = WeightedRoute(20, {"r1": "stable", "r2": "canary"})
    intent = TrafficIntent("canary", {"chatfleet.io/track": "stable"}, route=route)
    objects = traffic_objects(context(SPEC, traffic="HTTPRoute"), intent)
    assert kinds(objects) == [("HTTPRoute", "bot"), ("Service", "bot"), ("Service", "bot-canary")]
    backends = [
        (b["name"], b.get("weight"))
        for rule in objects[0]["spec"]["rules"]
        for b in rule.get("backendRefs", [])
    ]
    assert ("bot", 80) in backends and ("bot-canary", 20) in backends
    assert "sessionAffinity" not in objects[1]["spec"]


def test_a_strategys_header_rule_follows_the_pins_and_comes_before_the_weights():
    # a strategy routing by a header (an A/B variant) needs no edit of the router or the route builder
    route = WeightedRoute(0, {"r1": "stable"}, matches=(HeaderMatch("x-chatfleet-variant", "b", "canary"),))
    (http_route, *_) = traffic_objects(
        context(SPEC, traffic="HTTPRoute"), TrafficIntent("canary", route=route)
    )
    rules = [
        (
            [(h["name"], h["value"]) for m in r["matches"] for h in m.get("headers", [])],
            r["backendRefs"][0]["name"],
        )
        for r in http_route["spec"]["rules"]
    ]
    assert rules == [
        ([("x-chatfleet-revision", "r1")], "bot"),
        ([("x-chatfleet-variant", "b")], "bot-canary"),
        ([], "bot"),
    ]


def test_only_traefiks_mirror_method_adds_a_traefikservice():
    ctx = context(SPEC, traffic="HTTPRoute")
    for method, extra in (("RequestMirror", []), ("TraefikService", ["TraefikService"])):
        route = WeightedRoute(0, mirror=Mirror(10, method))
        objects = traffic_objects(ctx, TrafficIntent("canary", route=route))
        assert [k for k, _ in kinds(objects) if k not in ("HTTPRoute", "Service")] == extra, method


def test_the_route_attaches_to_the_operators_gateway():
    settings = replace(
        Settings(), release=replace(Settings().release, gateway_name="edge", gateway_namespace="infra")
    )
    ctx = context(SPEC, traffic="HTTPRoute", settings=settings)
    objects = traffic_objects(ctx, TrafficIntent("canary", route=WeightedRoute(0)))
    parents = objects[0]["spec"]["parentRefs"]
    assert [(p["name"], p.get("namespace")) for p in parents] == [("edge", "infra")]
