"""InferencePool routing (builders/inferencepool.py, release/router.py, release/route.py): where the cluster
serves the Gateway API Inference Extension, the canary's HTTPRoute sends its weights to one InferencePool
per track, picked by the ChatbotService's endpoint picker, which runs under the chart's ServiceAccount.

Test design: the objects of one pass built from a context with backends InferencePool, read back from the
manifests (the route's backends, the pools' selectors and picker ports, the picker's objects), and the
status.routing the pass reports from the pools' observed status.parents.
"""

from __future__ import annotations

from dataclasses import replace

from chatfleet_operator.builders.httproute import Mirror
from chatfleet_operator.builders.inferencepool import PICKER_PORTS
from chatfleet_operator.converge.changes import diff_children
from chatfleet_operator.kinds import DELETABLE, DELETABLE_COMPONENTS
from chatfleet_operator.release.route import routing_status
from chatfleet_operator.release.router import TrafficIntent, WeightedRoute, traffic_objects
from chatfleet_operator.settings import Settings
from pass_helpers import by_key, context, pass_children

SPEC = {"model": {"uri": "hf://org/m"}, "scaling": {"replicas": 2}}


def pooled(**kw):
    return context(SPEC, traffic="HTTPRoute", backends="InferencePool", **kw)


def test_the_route_sends_its_weights_and_pins_to_one_pool_per_track():
    route = WeightedRoute(20, {"r1": "stable", "r2": "canary"})
    objects = by_key(
        traffic_objects(pooled(), TrafficIntent("canary", {"chatfleet.io/track": "stable"}, route=route))
    )
    rules = objects[("HTTPRoute", "bot")]["spec"]["rules"]
    refs = [(b.get("kind"), b["name"], b.get("weight")) for rule in rules for b in rule["backendRefs"]]
    assert ("InferencePool", "bot", 80) in refs and ("InferencePool", "bot-canary", 20) in refs
    assert ("InferencePool", "bot", 1) in refs and ("InferencePool", "bot-canary", 1) in refs  # the pins
    assert all(b.get("group") == "inference.networking.k8s.io" for rule in rules for b in rule["backendRefs"])
    # the Services stay (probes, the shadow port, anything that calls them by name)
    assert ("Service", "bot") in objects and ("Service", "bot-canary") in objects


def test_each_pool_selects_its_tracks_pods_and_asks_its_own_picker_port():
    objects = by_key(traffic_objects(pooled(), TrafficIntent("canary", route=WeightedRoute(0))))
    for track, name in (("stable", "bot"), ("canary", "bot-canary")):
        spec = objects[("InferencePool", name)]["spec"]
        assert spec["selector"]["matchLabels"] == {"chatfleet.io/service": "bot", "chatfleet.io/track": track}
        assert spec["targetPorts"] == [{"number": 8080}]
        assert spec["endpointPickerRef"] == {
            "name": "bot-picker",
            "port": {"number": PICKER_PORTS[track]},
            "failureMode": "FailClose",
        }


def test_the_picker_runs_under_the_charts_service_account_and_no_fleet_object_selects_it():
    release = replace(Settings().release, picker_image="reg/picker:2", picker_service_account="pick")
    settings = replace(Settings(), release=release)
    objects = by_key(
        traffic_objects(pooled(settings=settings), TrafficIntent("canary", route=WeightedRoute(0)))
    )
    # the operator writes no RBAC: the chart writes the ServiceAccount and its pod-reading Role
    assert not {k for k, _ in objects if k in ("ServiceAccount", "Role", "RoleBinding")}
    dep = objects[("Deployment", "bot-picker")]
    pod = dep["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "pick"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "reg/picker:2"
    assert "--selector=chatfleet.io/service=bot" in container["args"]
    assert {"--pool=stable=9002", "--pool=canary=9003"} <= set(container["args"])
    assert (
        "chatfleet.io/service" not in pod["metadata"]["labels"]
    )  # no Service, pool or NetworkPolicy of the fleet
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    ports = {p["port"] for p in objects[("Service", "bot-picker")]["spec"]["ports"]}
    assert ports == set(PICKER_PORTS.values())
    assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]  # any node, by default


def test_the_picker_is_placed_by_the_operators_node_selector_and_tolerations():
    """A small CPU pod: placed where the operator's settings say (a system node pool), not by the fleet's
    GPU placement (spec.resources.nodeSelector / tolerations are the Triton pods')."""
    release = replace(
        Settings().release,
        picker_node_selector=(("pool", "system"),),
        picker_tolerations=(("dedicated", "system", "NoSchedule"), ("chatfleet.io/any", None, "")),
    )
    objects = by_key(
        traffic_objects(
            pooled(settings=replace(Settings(), release=release)),
            TrafficIntent("canary", route=WeightedRoute(0)),
        )
    )
    pod = objects[("Deployment", "bot-picker")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"},
        {"key": "chatfleet.io/any", "operator": "Exists"},
    ]


def test_with_pools_the_shadow_mirror_is_gateway_apis_filter_whatever_the_traefik_setting():
    settings = replace(Settings(), release=replace(Settings().release, gateway_mirror="TraefikService"))
    route = WeightedRoute(0, mirror=Mirror(10, "TraefikService"))
    objects = traffic_objects(pooled(settings=settings), TrafficIntent("canary", route=route))
    assert "TraefikService" not in [m["kind"] for m in objects]
    weighted = objects[0]["spec"]["rules"][-1]
    assert weighted["filters"][0]["type"] == "RequestMirror"
    assert weighted["filters"][0]["requestMirror"]["backendRef"]["name"] == "bot-canary"


def test_without_gateway_api_there_are_no_pools():
    ctx = context(SPEC, traffic="ReplicaRatio", backends="InferencePool")
    assert ctx.backends == "Service"
    kinds = {m["kind"] for m in pass_children(ctx)[1]}
    assert "InferencePool" not in kinds and ("Deployment", "bot-picker") not in by_key(pass_children(ctx)[1])


def test_going_back_to_services_deletes_the_pools_and_the_pickers_objects():
    _, with_pools = pass_children(pooled())
    observed = by_key(with_pools)
    _, with_services = pass_children(context(SPEC, traffic="HTTPRoute"))
    deleted = {
        (c.kind, c.name)
        for c in diff_children(with_services, observed, DELETABLE, DELETABLE_COMPONENTS)
        if c.verb == "delete"
    }
    assert deleted == {
        ("InferencePool", "bot"),
        ("InferencePool", "bot-canary"),
        ("Deployment", "bot-picker"),
        ("Service", "bot-picker"),
    }
    # never the fleet's own Deployments and Services
    assert not {k for k in deleted if k[1] in ("bot", "bot-canary") and k[0] in ("Deployment", "Service")}


def pool_with(status, reason, message=""):
    cond = [{"type": "Accepted", "status": status, "reason": reason, "message": message}]
    return {
        "metadata": {"namespace": "ns"},
        "status": {"parents": [{"parentRef": {"name": "chatfleet"}, "conditions": cond}]},
    }


def test_status_routing_says_the_backends_and_the_gateways_word_on_each_pool():
    ctx = pooled()
    children = {
        ("InferencePool", "bot"): pool_with("True", "Accepted"),
        ("InferencePool", "bot-canary"): pool_with("False", "InvalidExtensionRef", "no picker"),
    }
    st = routing_status(ctx, children)
    assert st["backends"] == "InferencePool"
    assert [(p["name"], p["status"], p["reason"]) for p in st["pools"]] == [
        ("bot", "True", "Accepted"),
        ("bot-canary", "False", "InvalidExtensionRef"),
    ]
    assert "InferencePool bot-canary: no picker" in st["pools"][1]["message"]
    assert st["picker"] == {"ready": False, "message": "the picker's Deployment is not written yet"}
    assert routing_status(ctx, {})["pools"][0]["status"] == "Unknown"
    no_account = {
        "status": {
            "conditions": [
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedCreate",
                    "message": 'serviceaccount "chatfleet-picker" not found',
                }
            ]
        }
    }
    picker = routing_status(ctx, {("Deployment", "bot-picker"): no_account})["picker"]
    assert picker == {"ready": False, "message": 'serviceaccount "chatfleet-picker" not found'}
    ready = {"status": {"readyReplicas": 1}}
    assert routing_status(ctx, {("Deployment", "bot-picker"): ready})["picker"] == {"ready": True}
    assert routing_status(context(SPEC, traffic="HTTPRoute"), {}) == {"backends": "Service"}
    assert routing_status(replace(ctx, routed=False), children) is None


def test_kubectl_chatbot_status_shows_the_routing_and_each_pools_acceptance():
    from chatfleet_operator.plugin import render_tree

    st = {
        "phase": "Ready",
        "conditions": [{"type": "RouteServed", "status": "True", "reason": "Accepted"}],
        "routing": {
            "backends": "InferencePool",
            "pools": [
                {"name": "bot", "status": "True", "reason": "Accepted", "message": "fine"},
                {
                    "name": "bot-canary",
                    "status": "False",
                    "reason": "InvalidExtensionRef",
                    "message": "no picker",
                },
            ],
        },
    }
    text = render_tree({"metadata": {"namespace": "ns", "name": "bot"}, "status": st}, [])
    assert "Routing: HTTPRoute -> InferencePool, route served True (Accepted)" in text
    assert "InferencePool bot: accepted True (Accepted)" in text
    assert "InferencePool bot-canary: accepted False (InvalidExtensionRef): no picker" in text
    st["routing"]["picker"] = {"ready": False, "message": "serviceaccount not found"}
    text = render_tree({"metadata": {"namespace": "ns", "name": "bot"}, "status": st}, [])
    assert "Endpoint picker: not Ready: serviceaccount not found" in text
