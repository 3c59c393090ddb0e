"""The stream relay the operator runs in front of a fleet (spec.streamRelay, builders/relay.py).

Test design: the children of one pass built from a context (pass_helpers), read back from the manifests:
which objects exist on and off, what the relay is told (its one balanced upstream, the spec's stall and
resume limits), what it may do (no token, no service links, restricted), that nothing of the fleet
selects its pods, that turning it off deletes exactly its objects, and that it never starts a release.
"""

from __future__ import annotations

from chatfleet_operator.builders.common import revision_hash
from chatfleet_operator.converge.changes import diff_children
from chatfleet_operator.kinds import DELETABLE, DELETABLE_COMPONENTS
from chatfleet_operator.spec import ChatbotServiceSpec
from pass_helpers import by_key, context, pass_children

SPEC = {
    "model": {"uri": "hf://org/m"},
    "scaling": {"replicas": 2},
    "resources": {"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
}
RELAY = {**SPEC, "streamRelay": {"enabled": True, "replicas": 3, "stallSeconds": 9, "maxResumes": 2}}
IP = "10.96.0.42"


def replicas_service_observed(ip: str = IP) -> dict:
    return {("Service", "bot-replicas"): {"metadata": {"name": "bot-replicas"}, "spec": {"clusterIP": ip}}}


def test_off_by_default_no_relay_object():
    objects = by_key(pass_children(context(SPEC))[1])
    assert not [k for k in objects if "relay" in k[1] or k[1] == "bot-replicas"]
    assert ChatbotServiceSpec.from_dict(SPEC).stream_relay.enabled is False


def test_the_relay_waits_for_its_services_cluster_ip_then_goes_through_it():
    first = by_key(pass_children(context(RELAY))[1])
    # first pass: only the Service the relay goes through (the API server gives it its address)
    assert ("Service", "bot-replicas") in first and ("Deployment", "bot-relay") not in first
    main, through = first[("Service", "bot")], first[("Service", "bot-replicas")]
    assert through["spec"]["selector"] == main["spec"]["selector"]
    assert "sessionAffinity" not in through["spec"] and main["spec"].get("sessionAffinity") == "ClientIP"
    assert through["metadata"]["labels"]["app.kubernetes.io/component"] == "stream-relay"
    # next pass: the relay, its one upstream that address, balanced
    objects = by_key(pass_children(context(RELAY, children=replicas_service_observed()))[1])
    dep = objects[("Deployment", "bot-relay")]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python3", "-m", "chatfleet_runtime.relay"]
    args = container["args"]
    assert f"--upstream=http://{IP}:8080" in args and "--balanced" in args
    assert {"--stall-seconds=9", "--max-resumes=2", "--port=8080", "--metrics-port=9400"} <= set(args)
    assert "--first-byte-seconds=90" in args  # requestTimeoutSeconds (60) + 30: a fallback comes sooner
    assert dep["spec"]["replicas"] == 3
    assert objects[("Service", "bot-relay")]["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_the_relay_may_do_nothing_but_relay_and_nothing_of_the_fleet_selects_it():
    objects = by_key(pass_children(context(RELAY, children=replicas_service_observed()))[1])
    pod = objects[("Deployment", "bot-relay")]["spec"]["template"]
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "nvidia.com/gpu" not in str(container["resources"])
    # the fleet's nodes (its selector and tolerations): the relay runs where the fleet is allowed to
    assert spec["nodeSelector"] == {"pool": "gpu"} and spec["tolerations"] == [
        {"key": "gpu", "operator": "Exists"}
    ]
    labels = pod["metadata"]["labels"]
    assert "chatfleet.io/service" not in labels
    for (kind, name), m in objects.items():
        selector = (m.get("spec") or {}).get("selector") or {}
        selector = selector.get("matchLabels", selector)
        if kind in ("Service", "PodDisruptionBudget") and name != "bot-relay" and selector:
            assert not selector.items() <= labels.items(), name


def test_turning_it_off_deletes_its_objects_only():
    on = by_key(pass_children(context(RELAY, children=replicas_service_observed()))[1])
    off = pass_children(context(SPEC, children=on))[1]
    deleted = {
        (c.kind, c.name)
        for c in diff_children(off, on, DELETABLE, DELETABLE_COMPONENTS)
        if c.verb == "delete"
    }
    assert deleted == {("Deployment", "bot-relay"), ("Service", "bot-relay"), ("Service", "bot-replicas")}


def test_it_is_outside_the_revision():
    """Turning the relay on makes no new revision: no release, the fleet's pods untouched."""
    assert revision_hash(RELAY) == revision_hash(SPEC)
    assert context(RELAY).update_revision == context(SPEC).update_revision
    fleet = {k: v for k, v in by_key(pass_children(context(SPEC))[1]).items() if k[0] == "Deployment"}
    with_relay = by_key(pass_children(context(RELAY))[1])
    assert all(with_relay[k] == v for k, v in fleet.items())
