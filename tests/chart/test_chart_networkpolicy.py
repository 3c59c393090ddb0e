"""The fleets' NetworkPolicy: each of the chat API's ports open to its owner only (docs/security.md).

Test design: the policy is rendered from the chart and read against the pod the operator builds
(builders/deployment.py), so a port added to the pod without a rule, or a rule for a port the pod does not
have, fails here. The local platform's bridge CNI does not enforce NetworkPolicy (docs/local-platform.md):
what a policy-enforcing CNI does with it is Kubernetes' part, not tested here.
"""

from __future__ import annotations

import pytest
from chart_helpers import CHART, find, helm, render, set_flags
from chatfleet_operator.builders.deployment import (
    ADMIN_PORT,
    CHAT_PORT,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    SCRAPE_PORT,
    SHADOW_PORT,
    build_deployment,
)
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

ON = ["networkPolicy.fleets.enabled=true", "networkPolicy.fleets.gatewayNamespaces={gateway}"]


def fleet_policies(sets: list[str]) -> list[dict]:
    """The fleets' NetworkPolicies of a rendering."""
    return [d for d in find(render(sets), "NetworkPolicy") if d["metadata"]["name"].endswith("-fleets")]


def sources(policy: dict) -> dict[int, list[dict]]:
    """port -> the peers allowed to reach it."""
    return {p["port"]: rule["from"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}


def pod_ports() -> set[int]:
    """Every container port of the pod the operator builds."""
    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/model"}})
    dep = build_deployment(ObjectRef("ns", "bot", "uid"), spec, PodSettings(), revision="r1")
    return {
        p["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
    }


def test_off_by_default() -> None:
    assert fleet_policies([]) == []


def test_one_policy_per_fleet_namespace_for_the_fleets_pods() -> None:
    policies = fleet_policies([*ON, "networkPolicy.fleets.namespaces={team-a,team-b}"])
    assert [p["metadata"]["namespace"] for p in policies] == ["team-a", "team-b"]
    selector = policies[0]["spec"]["podSelector"]["matchExpressions"]
    assert {"key": "chatfleet.io/service", "operator": "Exists"} in selector
    assert policies[0]["spec"]["policyTypes"] == ["Ingress"]


def test_the_watched_namespaces_by_default_with_namespace_scope() -> None:
    sets = [*ON, "watch.scope=namespaces", "watch.namespaces={team-c}"]
    assert [p["metadata"]["namespace"] for p in fleet_policies(sets)] == ["team-c"]


def test_cluster_scope_needs_the_namespaces_named() -> None:
    proc = helm("template", "cf", str(CHART), *set_flags(ON), check=False)
    assert proc.returncode != 0 and "networkPolicy.fleets.namespaces" in proc.stderr


def test_each_port_from_its_owner_only() -> None:
    (policy,) = fleet_policies([*ON, "networkPolicy.fleets.namespaces={team-a}"])
    by_port = sources(policy)
    gateway = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gateway"]}]
    }
    prometheus = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}
        ]
    }
    (operator,) = by_port[ADMIN_PORT]
    assert by_port[CHAT_PORT] == [{"podSelector": {}}, operator, {"namespaceSelector": gateway}]
    assert by_port[SHADOW_PORT] == [{"namespaceSelector": gateway}]
    picker = {
        "matchLabels": {
            "app.kubernetes.io/component": "endpoint-picker",
            "app.kubernetes.io/managed-by": "chatfleet-operator",
        }
    }
    assert by_port[SCRAPE_PORT] == [{"podSelector": picker}, {"namespaceSelector": prometheus}]
    assert operator["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "chatfleet-system"}
    }
    assert operator["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "chatfleet-operator"
    # every port the pod declares has exactly one rule; Triton's ports have none (loopback only)
    assert set(by_port) == pod_ports() == {CHAT_PORT, SHADOW_PORT, ADMIN_PORT, SCRAPE_PORT}
    assert not {HTTP_PORT, GRPC_PORT, METRICS_PORT} & set(by_port)


def test_no_gateway_no_gateway_rule() -> None:
    sets = ["networkPolicy.fleets.enabled=true", "networkPolicy.fleets.namespaces={team-a}"]
    (policy,) = fleet_policies(sets)
    by_port = sources(policy)
    assert by_port[CHAT_PORT] == [{"podSelector": {}}, *by_port[ADMIN_PORT]] and SHADOW_PORT not in by_port


@pytest.mark.parametrize(
    "value", ["networkPolicy.fleets.gatewayNamespaces=gateway", "networkPolicy.fleets.bogus=1"]
)
def test_bad_values_are_refused_by_the_schema(value: str) -> None:
    proc = helm("template", "cf", str(CHART), *set_flags([*ON, value]), check=False)
    assert proc.returncode != 0 and "networkPolicy" in proc.stderr


def test_the_pickers_ports_from_the_gateway_and_their_metrics_from_prometheus_only() -> None:
    """InferencePool routing's endpoint pickers: their ext_proc ports (one per pool) from the gateway's
    namespaces, their metrics from Prometheus; the ports are the builder's (builders/inferencepool.py)."""
    from chatfleet_operator.builders.inferencepool import PICKER_METRICS_PORT, PICKER_PORTS, build_picker

    docs = render([*ON, "networkPolicy.fleets.namespaces={team-a}"])
    (policy,) = [d for d in find(docs, "NetworkPolicy") if d["metadata"]["name"].endswith("-pickers")]
    by_port = sources(policy)
    assert set(by_port) == {*PICKER_PORTS.values(), PICKER_METRICS_PORT}
    for port in PICKER_PORTS.values():
        assert by_port[port] == [
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gateway"]}
                    ]
                }
            }
        ]
    dep = build_picker(ObjectRef("ns", "bot", "uid"), "image", "account")[0]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    declared = {p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert declared == set(by_port)


def test_the_relays_chat_port_from_users_and_their_metrics_from_prometheus_only() -> None:
    """The stream relays (spec.streamRelay): their chat port from the namespace's pods and the gateway, as
    the fleet's own; their metrics from Prometheus; the ports and labels are the builder's (builders/relay.py)."""
    from chatfleet_operator.builders.relay import RELAY_METRICS_PORT, build_relay

    docs = render([*ON, "networkPolicy.fleets.namespaces={team-a}"])
    (policy,) = [d for d in find(docs, "NetworkPolicy") if d["metadata"]["name"].endswith("-relays")]
    by_port = sources(policy)
    assert set(by_port) == {CHAT_PORT, RELAY_METRICS_PORT}
    gateway = {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gateway"]}
            ]
        }
    }
    assert by_port[CHAT_PORT] == [{"podSelector": {}}, gateway]
    assert (
        gateway not in by_port[RELAY_METRICS_PORT] and {"podSelector": {}} not in by_port[RELAY_METRICS_PORT]
    )
    spec = ChatbotServiceSpec.from_dict({"streamRelay": {"enabled": True}})
    dep = build_relay(ObjectRef("ns", "bot", "uid"), spec, "10.96.0.9")[0]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    declared = {p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert declared == set(by_port)
