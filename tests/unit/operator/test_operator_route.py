"""The parent Gateway's word on the canary's HTTPRoute: its status read, the change signature, RouteServed.

Test design: table tests of the pure pieces (facts.route_parents and httproute_signature, route.route_state,
the Warning from the old -> new difference); then passes through reconcile_pass with the fake client of
test_operator_reconcile and a cluster that serves Gateway API, the route's status written by hand as a
Gateway controller would.
"""

from __future__ import annotations

import copy

import pytest
from chatfleet_operator import api
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.converge.facts import (
    GatewayCondition,
    RouteParent,
    httproute_signature,
    route_parents,
)
from chatfleet_operator.converge.status import get_condition, status_events
from chatfleet_operator.kinds import change_signature
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.release.route import route_state
from chatfleet_operator.settings import ReleaseSettings, Settings
from operator_helpers import cbs_body
from test_operator_reconcile import NODES, NOW, FakeClient

CONTROLLER = "traefik.io/gateway-controller"


def cond(ctype, status, reason="R", message="", generation=1, at="2026-11-21T10:00:00Z"):
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": at,
    }


def parent(*conditions, name="chatfleet", namespace=None, section=None, kind=None):
    ref = {"group": "gateway.networking.k8s.io", "name": name}
    if namespace:
        ref["namespace"] = namespace
    if section:
        ref["sectionName"] = section
    if kind:
        ref["kind"] = kind
    return {"parentRef": ref, "controllerName": CONTROLLER, "conditions": list(conditions)}


def route(*parents, with_status=True):
    """HTTPRoute bot in ns, with status.parents as given (no status at all: with_status False)."""
    body = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "bot", "namespace": "ns", "resourceVersion": "7"},
        "spec": {"parentRefs": [{"name": "chatfleet"}], "rules": [{"backendRefs": [{"name": "bot"}]}]},
    }
    if with_status:
        body["status"] = {"parents": list(parents)}
    return body


ACCEPTED = cond("Accepted", "True", "Accepted")
RESOLVED = cond("ResolvedRefs", "True", "ResolvedRefs")
NO_LISTENER = cond("Accepted", "False", "NotAllowedByListeners", "no listener allows HTTPRoute in ns")


class TestRouteParents:
    def test_reads_each_gateways_conditions_with_the_routes_namespace_by_default(self):
        body = route(
            parent(NO_LISTENER, RESOLVED),
            parent(ACCEPTED, name="other", namespace="edge", section="https"),
            parent(ACCEPTED, name="mesh", kind="Service"),  # not a Gateway: left out
        )
        assert route_parents(body) == (
            RouteParent(
                "edge", "other", "https", CONTROLLER, GatewayCondition("True", "Accepted"), GatewayCondition()
            ),
            RouteParent(
                "ns",
                "chatfleet",
                "",
                CONTROLLER,
                GatewayCondition("False", "NotAllowedByListeners", "no listener allows HTTPRoute in ns"),
                GatewayCondition("True", "ResolvedRefs"),
            ),
        )

    def test_no_status_is_no_parent(self):
        assert route_parents(route(with_status=False)) == ()


class TestSignature:
    """A pass when a Gateway's answer changes; none when it only rewrites the same answer (no hot loop)."""

    def test_a_flip_of_accepted_changes_it(self):
        assert httproute_signature(route(parent(ACCEPTED))) != httproute_signature(route(parent(NO_LISTENER)))

    def test_the_first_answer_changes_it(self):
        assert httproute_signature(route(with_status=False)) != httproute_signature(route(parent(ACCEPTED)))

    def test_a_new_reason_of_resolved_refs_changes_it(self):
        missing = cond("ResolvedRefs", "False", "BackendNotFound")
        forbidden = cond("ResolvedRefs", "False", "RefNotPermitted")
        assert httproute_signature(route(parent(ACCEPTED, missing))) != httproute_signature(
            route(parent(ACCEPTED, forbidden))
        )

    def test_timestamps_generations_and_messages_alone_do_not(self):
        before = route(parent(ACCEPTED, RESOLVED))
        after = route(
            parent(
                cond("Accepted", "True", "Accepted", "accepted at gen 2", 2, "2026-11-21T11:00:00Z"),
                cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, "2026-11-21T11:00:00Z"),
            )
        )
        assert httproute_signature(before) == httproute_signature(after)

    def test_a_spec_change_still_changes_it(self):
        edited = route(parent(ACCEPTED))
        edited["spec"]["hostnames"] = ["chat.example.com"]
        assert httproute_signature(route(parent(ACCEPTED))) != httproute_signature(edited)

    def test_the_kinds_table_uses_it_and_the_world_triggers_on_a_flip_only(self):
        assert change_signature("HTTPRoute", route(parent(ACCEPTED))) == httproute_signature(
            route(parent(ACCEPTED))
        )
        world = World()
        assert world.changed("HTTPRoute", route(with_status=False))  # first sight
        assert world.changed("HTTPRoute", route(parent(ACCEPTED)))  # the Gateway answered
        rewritten = route(parent(cond("Accepted", "True", "Accepted", "", 3, "2026-11-21T12:00:00Z")))
        assert not world.changed("HTTPRoute", rewritten)  # the same answer, rewritten
        assert world.changed("HTTPRoute", route(parent(NO_LISTENER)))  # refused


class TestRouteState:
    @pytest.mark.parametrize(
        ("body", "status", "reason", "words"),
        [
            pytest.param(None, "Unknown", "Pending", "not written yet", id="not-written"),
            pytest.param(
                route(with_status=False),
                "Unknown",
                "Pending",
                "No controller of Gateway ns/chatfleet has answered for HTTPRoute bot yet",
                id="no-status-is-unknown-not-false",
            ),
            pytest.param(
                route(parent(ACCEPTED, name="elsewhere")),
                "Unknown",
                "Pending",
                "No controller of Gateway ns/chatfleet",
                id="only-another-gateway-answered",
            ),
            pytest.param(
                route(parent(NO_LISTENER, RESOLVED)),
                "False",
                "NotAllowedByListeners",
                "Gateway ns/chatfleet does not accept HTTPRoute bot: no listener allows HTTPRoute in ns",
                id="accepted-false-keeps-the-gateways-reason",
            ),
            pytest.param(
                route(parent(cond("Accepted", "False", ""))),
                "False",
                "RouteNotAccepted",
                "Gateway ns/chatfleet does not accept HTTPRoute bot",
                id="accepted-false-without-reason",
            ),
            pytest.param(
                route(
                    parent(ACCEPTED, cond("ResolvedRefs", "False", "BackendNotFound", "bot-canary not found"))
                ),
                "False",
                "BackendNotFound",
                "cannot resolve the backends of HTTPRoute bot: bot-canary not found",
                id="resolved-refs-false",
            ),
            pytest.param(
                route(parent(ACCEPTED, section="http"), parent(NO_LISTENER, section="https")),
                "False",
                "NotAllowedByListeners",
                "does not accept",
                id="one-refusing-listener-outranks",
            ),
            pytest.param(
                route(parent(cond("Accepted", "Unknown", "Pending", "waiting for the Gateway"))),
                "Unknown",
                "Pending",
                "has not accepted HTTPRoute bot yet: waiting for the Gateway",
                id="accepted-unknown",
            ),
            pytest.param(
                route(parent(ACCEPTED, RESOLVED)),
                "True",
                "Accepted",
                "Gateway ns/chatfleet serves HTTPRoute bot",
                id="served",
            ),
        ],
    )
    def test_condition(self, body, status, reason, words):
        c = route_state(body, "bot", "ns", "chatfleet").condition(4)
        assert (c["type"], c["status"], c["reason"], c["observedGeneration"]) == (
            "RouteServed",
            status,
            reason,
            4,
        )
        assert words in c["message"]

    def test_a_gateway_in_another_namespace_is_matched_by_its_namespace(self):
        body = route(parent(NO_LISTENER, name="shared", namespace="gateways"))
        assert route_state(body, "bot", "gateways", "shared").status == "False"
        assert route_state(body, "bot", "ns", "shared").status == "Unknown"

    def test_a_long_gateway_message_is_bounded(self):
        body = route(parent(cond("Accepted", "False", "NotAllowedByListeners", "x" * 40_000)))
        assert len(route_state(body, "bot", "ns", "chatfleet").message) < 1200


class TestRouteEvents:
    def served(self, status, reason):
        return {"conditions": [{"type": "RouteServed", "status": status, "reason": reason, "message": "m"}]}

    def test_one_warning_when_it_turns_false_and_none_while_it_stays(self):
        refused = self.served("False", "NotAllowedByListeners")
        for before in ({}, self.served("True", "Accepted"), self.served("Unknown", "Pending")):
            assert [(e.type, e.reason) for e in status_events(before, refused)] == [
                ("Warning", "NotAllowedByListeners")
            ]
        assert status_events(refused, refused) == []

    def test_a_new_reason_while_false_is_one_more_warning(self):
        old, new = self.served("False", "NotAllowedByListeners"), self.served("False", "BackendNotFound")
        assert [e.reason for e in status_events(old, new)] == ["BackendNotFound"]

    def test_no_event_for_unknown_or_true(self):
        assert status_events({}, self.served("Unknown", "Pending")) == []
        assert status_events(self.served("False", "X"), self.served("True", "Accepted")) == []


def one_pass(body, client, snap, settings=None):
    releases = Releases(serves_gateway_api=lambda: True)
    return reconcile_pass(client, body, snap, World(), settings or Settings(), NOW, releases=releases)


class TestRouteServedInAPass:
    def test_the_condition_follows_the_gateway_with_one_warning(self):
        client, snap, body = FakeClient(), Snapshot(nodes=NODES), cbs_body()
        out = one_pass(body, client, snap)
        written = snap.children[("HTTPRoute", "bot")]
        assert get_condition(out.status, "RouteServed")["status"] == "Unknown"  # no controller answered yet
        assert get_condition(out.status, "Ready")  # the steady conditions stay as they are
        body["status"] = out.status

        # the Gateway refuses the route: False with its reason, naming the Gateway, and one Warning
        refused = copy.deepcopy(written)
        refused["status"] = {"parents": [parent(NO_LISTENER)]}
        snap.children[("HTTPRoute", "bot")] = refused
        client.writes.clear()
        out = one_pass(body, client, snap)
        served = get_condition(out.status, "RouteServed")
        assert (served["status"], served["reason"]) == ("False", "NotAllowedByListeners")
        assert "Gateway ns/chatfleet" in served["message"]
        assert ("event", ("Warning", "NotAllowedByListeners")) in client.writes
        assert [w[0] for w in client.writes] == ["status", "event"]  # the route itself is not written again
        body["status"] = out.status

        # the same refusal seen again: no write, no event
        client.writes.clear()
        one_pass(body, client, snap)
        assert client.writes == []

        # accepted: True, no event
        accepted = copy.deepcopy(written)
        accepted["status"] = {"parents": [parent(ACCEPTED, RESOLVED)]}
        snap.children[("HTTPRoute", "bot")] = accepted
        client.writes.clear()
        out = one_pass(body, client, snap)
        assert get_condition(out.status, "RouteServed")["status"] == "True"
        assert [w[0] for w in client.writes] == ["status"]

    def test_the_gateway_of_the_operators_settings_is_the_one_read(self):
        settings = Settings(release=ReleaseSettings(gateway_name="shared", gateway_namespace="gateways"))
        client, snap, body = FakeClient(), Snapshot(nodes=NODES), cbs_body()
        one_pass(body, client, snap, settings)
        route_body = copy.deepcopy(snap.children[("HTTPRoute", "bot")])
        route_body["status"] = {
            "parents": [parent(NO_LISTENER), parent(ACCEPTED, name="shared", namespace="gateways")]
        }
        snap.children[("HTTPRoute", "bot")] = route_body
        out = one_pass(body, client, snap, settings)
        assert get_condition(out.status, "RouteServed")["status"] == "True"

    def test_no_condition_without_a_route(self):
        # replica ratio (no Gateway API): no HTTPRoute, no condition
        out = reconcile_pass(FakeClient(), cbs_body(), Snapshot(nodes=NODES), World(), Settings(), NOW)
        assert get_condition(out.status, api.COND_ROUTE_SERVED) is None
        # blue-green behind Gateway API: Services only, no route either
        spec = {"model": {"uri": "hf://org/model"}, "rollout": {"strategy": "blueGreen"}}
        out = one_pass(cbs_body(spec), FakeClient(), Snapshot(nodes=NODES))
        assert get_condition(out.status, api.COND_ROUTE_SERVED) is None
