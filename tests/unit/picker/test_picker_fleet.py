"""The picker's view of the fleet (chatfleet_picker.fleet) and the request's dialogue key (server)."""

from __future__ import annotations

from chatfleet_picker.fleet import Fleet, endpoint_of_pod, parse_load, route_split
from chatfleet_picker.server import dialogue_key, static_fleet


def pod(ip="10.0.0.1", ready="True", labels=None, deleting=False):
    meta = {
        "uid": "u1",
        "labels": {"chatfleet.io/track": "stable", "chatfleet.io/revision": "a", **(labels or {})},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    return {"metadata": meta, "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}}


def test_a_ready_pod_is_a_ready_replica_of_its_track_and_revision():
    r = endpoint_of_pod(pod(), 8080, 8090)
    assert (r.endpoint.address, r.endpoint.track, r.endpoint.revision, r.endpoint.ready) == (
        "10.0.0.1:8080",
        "stable",
        "a",
        True,
    )
    assert r.metrics_url == "http://10.0.0.1:8090/metrics"


def test_unready_deleting_and_standby_pods_take_no_traffic_and_a_pod_without_ip_is_no_replica():
    assert not endpoint_of_pod(pod(ready="False"), 8080, 8090).endpoint.ready
    assert not endpoint_of_pod(pod(deleting=True), 8080, 8090).endpoint.ready
    assert not endpoint_of_pod(pod(labels={"chatfleet.io/serving": "false"}), 8080, 8090).endpoint.ready
    assert endpoint_of_pod(pod(ip=None), 8080, 8090) is None


def test_load_is_the_inflight_sum_and_the_kv_fill():
    text = (
        "# HELP chatfleet_inflight_requests x\n"
        'chatfleet_inflight_requests{model="a"} 2.0\n'
        'chatfleet_inflight_requests{model="b"} 1.0\n'
        "chatfleet_model_prefix_cache_bytes 300\n"
        "chatfleet_model_prefix_cache_capacity_bytes 400\n"
    )
    assert parse_load(text) == (3.0, 0.75)
    assert parse_load("chatfleet_inflight_requests 1\n") == (1.0, 0.0)


def test_a_pod_update_keeps_its_last_load_and_a_deleted_pod_leaves():
    fleet = Fleet()
    fleet.put_pod("u1", endpoint_of_pod(pod(), 8080, 8090))
    fleet.set_load("10.0.0.1:8080", 5.0, 0.5)
    fleet.put_pod("u1", endpoint_of_pod(pod(ready="False"), 8080, 8090))
    (e,) = fleet.endpoints()
    assert (e.queue, e.kv_usage, e.ready) == (5.0, 0.5, False)
    fleet.put_pod("u1", None)
    assert fleet.endpoints() == []


def test_the_dialogue_key_is_read_as_the_chat_api_reads_it():
    assert dialogue_key({"x-session-id": "s1"}, b'{"session_id": "s2"}') == "s1"
    assert dialogue_key({}, b'{"session_id": "s2", "user": "u"}') == "s2"
    assert dialogue_key({}, b'{"user": "u"}') == "user:u"
    assert dialogue_key({}, b"[1, 2]") is None
    assert dialogue_key({}, b"") is None


def test_a_static_fleet_names_its_replicas_and_refuses_a_bad_spec():
    import pytest

    fleet = static_fleet(["127.0.0.1:9101,stable,a", "127.0.0.1:9102,canary,b,http://127.0.0.1:9/metrics"])
    assert [(e.address, e.track, e.revision) for e in fleet.endpoints()] == [
        ("127.0.0.1:9101", "stable", "a"),
        ("127.0.0.1:9102", "canary", "b"),
    ]
    with pytest.raises(ValueError, match="address,track,revision"):
        static_fleet(["127.0.0.1:9101"])


POOLS = {"bot": "stable", "bot-canary": "canary"}


def pool_ref(name, weight=None):
    ref = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name}
    return ref if weight is None else {**ref, "weight": weight}


def test_the_routes_weights_and_pins_are_read_from_its_rules_over_the_pools():
    pinned = {
        "matches": [{"headers": [{"name": "X-Chatfleet-Revision", "value": "a"}]}],
        "backendRefs": [pool_ref("bot")],
    }
    split = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [pool_ref("bot", 80), pool_ref("bot-canary", 20)],
    }
    read = route_split({"spec": {"rules": [pinned, split]}}, POOLS)
    assert read.weights == {"stable": 80, "canary": 20}
    assert read.pins == ((("x-chatfleet-revision", "a"),),)
    assert read.pinned({"x-chatfleet-revision": "a"}) and not read.pinned({"x-chatfleet-revision": "b"})
    assert not read.pinned({})
    # a backend without a weight weighs 1 (Gateway API's default)
    assert route_split({"spec": {"rules": [{"backendRefs": [pool_ref("bot")]}]}}, POOLS).weights == {
        "stable": 1
    }


def test_a_route_with_no_rule_over_the_pools_gives_no_weights_and_no_pins():
    services = {"backendRefs": [{"kind": "Service", "name": "bot", "weight": 100}]}
    other_pool = {
        "matches": [{"headers": [{"name": "x", "value": "y"}]}],
        "backendRefs": [pool_ref("someone-else", 100)],
    }
    assert route_split({"spec": {"rules": [services, other_pool]}}, POOLS) == route_split({}, POOLS)
    assert route_split({}, POOLS).weights is None and not route_split({}, POOLS).pins
