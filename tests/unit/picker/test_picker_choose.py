"""The endpoint picker's choice (chatfleet_picker.choose): affinity, revision stickiness, load, weights."""

from __future__ import annotations

import collections

from chatfleet_picker.choose import AFFINITY, ANY, NEW, REVISION, Endpoint, Limits, Picker

S1 = Endpoint("10.0.0.1:8080", "a", "stable")
S2 = Endpoint("10.0.0.2:8080", "a", "stable")
C1 = Endpoint("10.0.0.3:8080", "b", "canary")
FLEET = [S1, S2, C1]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_dialogue_stays_on_the_replica_that_holds_its_prefix():
    picker = Picker()
    first = picker.pick("d1", "stable", FLEET)
    assert first.reason == NEW and first.revision == "a"
    for _ in range(5):
        again = picker.pick("d1", "stable", FLEET)
        assert (again.address, again.reason) == (first.address, AFFINITY)


def test_a_dialogue_keeps_its_revision_when_the_route_sends_it_to_the_other_pool():
    picker = Picker()
    first = picker.pick("d1", "stable", FLEET)
    # the weights moved: the gateway now sends this request to the canary's pool
    again = picker.pick("d1", "canary", FLEET)
    assert again.address == first.address and again.revision == "a"
    # a dialogue begun on the canary stays there when the gateway picks stable
    c = picker.pick("d2", "canary", FLEET)
    assert c.address == C1.address
    assert picker.pick("d2", "stable", FLEET).address == C1.address


def test_a_saturated_replica_sends_the_dialogue_to_another_of_its_revision_never_to_another_revision():
    picker = Picker(Limits(max_queue=4))
    home = picker.pick("d1", "stable", FLEET).address
    busy = [Endpoint(e.address, e.revision, e.track, queue=4.0) if e.address == home else e for e in FLEET]
    moved = picker.pick("d1", "stable", busy)
    assert moved.reason == REVISION and moved.address != home and moved.revision == "a"
    # it now lives there: the next turn is affinity on its new replica
    assert picker.pick("d1", "stable", FLEET).reason == AFFINITY
    assert picker.pick("d1", "stable", FLEET).address == moved.address
    # every replica of its revision saturated: it still stays on its revision (least loaded of it)
    full = [Endpoint(e.address, e.revision, e.track, queue=9.0) if e.revision == "a" else e for e in FLEET]
    assert picker.pick("d1", "stable", full).revision == "a"


def test_a_full_prefix_store_is_no_saturation_the_dialogue_stays_on_its_prefix():
    # the prefix store is an LRU cache: full on a warm replica; counting it as saturation moved dialogues
    # off the replica holding their prefix (bench-routing on pods, 8 layers, long histories: 20.8 % kept)
    picker = Picker()
    home = picker.pick("d1", "stable", FLEET).address
    warm = [Endpoint(e.address, e.revision, e.track, kv_usage=1.0) for e in FLEET]
    assert picker.pick("d1", "stable", warm).address == home


def test_when_every_replica_of_its_revision_is_saturated_the_dialogue_stays_home():
    picker = Picker(Limits(max_queue=4))
    home = picker.pick("d1", "stable", FLEET).address
    busy = [Endpoint(e.address, e.revision, e.track, queue=5) for e in FLEET]
    choice = picker.pick("d1", "stable", busy)
    assert (choice.address, choice.reason) == (home, AFFINITY)


def test_when_its_revision_has_no_replica_left_the_dialogue_takes_the_routed_track():
    picker = Picker()
    picker.pick("d1", "canary", FLEET)  # on revision b
    rolled_back = [S1, S2]  # the canary is gone
    choice = picker.pick("d1", "stable", rolled_back)
    assert choice.reason == NEW and choice.revision == "a"
    assert picker.pick("d1", "stable", rolled_back).reason == AFFINITY


def test_new_dialogues_go_to_the_routed_track_and_spread_over_its_replicas():
    picker = Picker()
    counts = collections.Counter(picker.pick(f"d{i}", "stable", FLEET).address for i in range(100))
    assert set(counts) == {S1.address, S2.address}
    assert min(counts.values()) >= 40  # picks since the last metrics read even the split


def test_new_dialogues_prefer_the_least_loaded_replica():
    picker = Picker()
    loaded = [Endpoint(S1.address, "a", "stable", queue=3.0), S2, C1]
    assert picker.pick("d1", "stable", loaded).address == S2.address
    kv = [
        Endpoint(S1.address, "a", "stable", kv_usage=0.8),
        Endpoint(S2.address, "a", "stable", kv_usage=0.1),
        C1,
    ]
    assert Picker().pick("d2", "stable", kv).address == S2.address


def test_picks_since_the_last_metrics_read_count_until_observed():
    picker = Picker()
    one = [S1]
    for i in range(3):
        picker.pick(f"d{i}", "stable", one)
    # S1 has 3 picks since its read; an idle S2 appears and takes the next new dialogue
    assert picker.pick("dx", "stable", [S1, S2]).address == S2.address
    picker.observe([S1.address, S2.address], [S1.address, S2.address])
    assert picker._sent == {}


def test_the_picks_of_a_replica_that_left_the_fleet_are_forgotten():
    picker = Picker()
    picker.pick("d1", "stable", [S1])
    picker.pick("d2", "stable", [S2])
    # S2's pod is gone before its metrics were read again: only S1 is read, and only S1 is in the fleet
    picker.observe([], [S1.address])
    assert picker._sent == {S1.address: 1}


def test_no_ready_replica_on_the_routed_track_takes_any_ready_one_and_none_at_all_is_none():
    picker = Picker()
    not_ready = [Endpoint(S1.address, "a", "stable", ready=False), C1]
    assert picker.pick("d1", "stable", not_ready).reason == ANY
    assert picker.pick("d2", "stable", [Endpoint(S1.address, "a", "stable", ready=False)]) is None


def test_requests_without_a_dialogue_key_are_not_remembered():
    picker = Picker()
    assert picker.pick(None, "stable", FLEET).reason == NEW
    assert len(picker) == 0


def test_idle_dialogues_are_forgotten_and_the_table_is_bounded():
    clock = Clock()
    picker = Picker(Limits(sessions=3, session_ttl_s=60), clock=clock)
    picker.pick("old", "canary", FLEET)
    clock.now = 61
    assert picker.pick("old", "stable", FLEET).reason == NEW  # forgotten: follows the route
    for i in range(10):
        picker.pick(f"d{i}", "stable", FLEET)
    assert len(picker) == 3


def test_with_the_routes_weights_new_dialogues_take_each_track_at_exactly_its_weight():
    picker = Picker()
    picker.set_weights({"stable": 80, "canary": 20})
    # the gateway's draw sends every one of them to the stable pool: the weights decide, not the draw
    tracks = [picker.pick(f"d{i}", "stable", FLEET).revision for i in range(60)]
    assert tracks[:5] == ["a", "a", "b", "a", "a"]  # smooth: the canary's turns are spread out
    assert tracks.count("b") == 12  # 20 % of 60, exactly
    # known dialogues keep their revision whatever the weights say
    assert all(picker.pick(f"d{i}", "canary", FLEET).revision == tracks[i] for i in range(60))


def test_a_change_of_weights_starts_the_round_afresh_and_tracks_without_a_ready_replica_are_skipped():
    picker = Picker()
    picker.set_weights({"stable": 50, "canary": 50})
    assert [picker.pick(f"a{i}", "stable", FLEET).revision for i in range(4)].count("b") == 2
    picker.set_weights({"stable": 0, "canary": 100})
    assert {picker.pick(f"b{i}", "stable", FLEET).revision for i in range(5)} == {"b"}
    # the canary has no ready replica: new dialogues go to the weighted tracks that have one
    picker.set_weights({"stable": 50, "canary": 50})
    stable_only = [S1, S2, Endpoint(C1.address, "b", "canary", ready=False)]
    assert {picker.pick(f"c{i}", "canary", stable_only).revision for i in range(4)} == {"a"}


def test_without_weights_new_dialogues_take_the_gateways_track():
    picker = Picker()
    picker.set_weights({"stable": 80, "canary": 20})
    picker.set_weights(None)
    assert {picker.pick(f"d{i}", "canary", FLEET).revision for i in range(10)} == {"b"}


def test_a_request_pinned_to_its_pool_by_the_route_keeps_the_gateways_track():
    picker = Picker()
    picker.set_weights({"stable": 0, "canary": 100})
    assert picker.pick("p1", "stable", FLEET, by_weight=False).revision == "a"
    assert picker.pick("n1", "stable", FLEET).revision == "b"
