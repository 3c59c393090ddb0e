"""spec.observability.tracing: the chat API's OpenTelemetry environment, outside the revision.

Test design: the builder's chat-api container is read for the OTEL_* environment with and without the
section (a spec without it must keep the pod template it had); the revision hash and a reconcile pass over
a converged fleet show a tracing change is a same-revision template change (the stable Deployment is
written again, no canary, no release). The CRD's default of samplingRatio agreeing with the typed spec's
is checked with the other defaults (test_operator_crd.py, id "tracing").
"""

from __future__ import annotations

from typing import Any

from chatfleet_operator.builders import build_deployment, revision_hash
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import PodSettings, Settings
from chatfleet_operator.spec import DEFAULT_SAMPLING_RATIO, ChatbotServiceSpec, ObjectRef, TracingSpec
from operator_helpers import cbs_body
from test_operator_reconcile import NODES, NOW, FakeClient

REF = ObjectRef("support", "bot", "uid-1", 1)
COLLECTOR = "http://otel-collector.monitoring:4318"


def spec(tracing: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": {"uri": "hf://org/model"}, **extra}
    if tracing is not None:
        out["observability"] = {"tracing": tracing}
    return out


def template(raw: dict[str, Any]) -> dict[str, Any]:
    dep = build_deployment(REF, ChatbotServiceSpec.from_dict(raw), PodSettings(), revision="r1")
    return dep["spec"]["template"]


def chat_env(raw: dict[str, Any]) -> list[dict[str, Any]]:
    (chat,) = [c for c in template(raw)["spec"]["containers"] if c["name"] == "chat-api"]
    return chat["env"]


def test_a_spec_without_tracing_keeps_its_pod_template():
    plain = template(spec())
    assert template(spec(observability={})) == plain
    assert template(spec(observability={"tracing": None})) == plain
    assert not any(e["name"].startswith("OTEL_") for e in chat_env(spec()))
    triton = [c for c in plain["spec"]["containers"] if c["name"] == "triton"]
    assert not any(e["name"].startswith("OTEL_") for e in triton[0]["env"])


def test_tracing_gives_the_chat_api_the_standard_otel_environment():
    env = chat_env(spec({"endpoint": COLLECTOR, "samplingRatio": 0.25}))
    otel = [e for e in env if e["name"].startswith("OTEL_")]
    assert otel == [
        {"name": "OTEL_SERVICE_NAME", "value": "bot"},
        {
            "name": "OTEL_RESOURCE_ATTRIBUTES",
            "value": "k8s.namespace.name=support,"
            "chatfleet.track=$(CHATFLEET_TRACK),chatfleet.revision=$(CHATFLEET_REVISION)",
        },
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": COLLECTOR},
        {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": "0.25"},
    ]
    # Kubernetes expands $(VAR) only from the entries before it: the downward API's track and revision
    names = [e["name"] for e in env]
    assert names.index("CHATFLEET_TRACK") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert names.index("CHATFLEET_REVISION") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    # nothing else of the template moved: the same env with the OTEL_ entries left out
    assert [e for e in env if not e["name"].startswith("OTEL_")] == chat_env(spec())


def test_the_sampling_ratio_defaults_to_one_in_ten(crd_schema):
    tracing = crd_schema["properties"]["spec"]["properties"]["observability"]["properties"]["tracing"]
    assert tracing["required"] == ["endpoint"]
    assert tracing["properties"]["samplingRatio"]["default"] == DEFAULT_SAMPLING_RATIO == 0.1
    parsed = ChatbotServiceSpec.from_dict(spec({"endpoint": COLLECTOR})).observability.tracing
    assert parsed == TracingSpec(COLLECTOR, 0.1)
    values = {e["name"]: e.get("value") for e in chat_env(spec({"endpoint": COLLECTOR}))}
    assert values["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert TracingSpec(COLLECTOR, 1).sampler_arg() == "1" and TracingSpec(COLLECTOR, 0).sampler_arg() == "0"


def test_a_tracing_change_is_a_new_template_but_no_new_revision():
    none, on = spec(), spec({"endpoint": COLLECTOR})
    other = spec({"endpoint": "https://collector.example:4318", "samplingRatio": 1})
    assert revision_hash(none) == revision_hash(on) == revision_hash(other)
    assert len({str(template(s)) for s in (none, on, other)}) == 3


def _applied(client: FakeClient) -> list[tuple[str, str]]:
    return [w[1] for w in client.writes if w[0] == "apply"]


def test_a_pass_rolls_the_stable_deployment_for_a_tracing_change_without_a_release():
    body = cbs_body(spec())
    snap = Snapshot(nodes=NODES)

    def run() -> FakeClient:
        client = FakeClient()
        outcome = reconcile_pass(client, body, snap, World(), Settings(), NOW)
        body["status"] = outcome.status
        return client

    run()
    assert _applied(run()) == []  # converged
    revision = body["status"]["updateRevision"]

    body["spec"] = spec({"endpoint": COLLECTOR})
    body["metadata"]["generation"] += 1
    assert _applied(run()) == [("Deployment", "bot")]  # the stable one, in place: no canary Deployment
    assert body["status"]["updateRevision"] == revision
    assert (body["status"].get("release") or {}).get("phase") in (None, "Idle")
    written = snap.children[("Deployment", "bot")]["spec"]["template"]
    (chat,) = [c for c in written["spec"]["containers"] if c["name"] == "chat-api"]
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": COLLECTOR} in chat["env"]
    assert written["metadata"]["labels"]["chatfleet.io/revision"] == revision
