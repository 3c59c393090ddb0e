"""spec.fallback reaches every pod as its chatfleet.io/fallback annotation, never through a release.

Test design: passes against the fake API client of the reconcile tests, with pods summarised by the
operator's own `pod_facts` from Pod bodies (so the annotation and its digest are read as the watch cache
would read them). What a pass patches on pods, and what it applies, say whether the FAQ and breaker
travel without a release or a restart; the builders' template says where the chat API reads them.
"""

from __future__ import annotations

import json
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders import revision_hash
from chatfleet_operator.builders.deployment import FALLBACK_FILE
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.converge.facts import QUIET_POD, pod_facts, pod_signature
from chatfleet_operator.converge.fallback import PodAnnotation, plan_fallback
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import ChatbotServiceSpec, FallbackSpec
from operator_helpers import cbs_body
from test_operator_reconcile import NODES, NOW, FakeClient

FAQ = {
    "faq": [
        {"question": "What are your opening hours?", "answer": "9 to 5"},
        {"keywords": ["refund"], "answer": "Within 14 days."},
    ],
    "breaker": {"failures": 5, "resetSeconds": 10},
}


class PodClient(FakeClient):
    """The reconcile tests' fake client, recording pod patches too."""

    def label_pod(self, namespace, name, labels, annotations):
        self.writes.append(("pod", (name, dict(labels), dict(annotations))))


def pod(
    name: str, track: str = "stable", annotation: str | None = None, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": {api.LABEL_TRACK: track, api.LABEL_REVISION: "r"},
        "annotations": {} if annotation is None else {api.ANNOTATION_FALLBACK: annotation},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-21T10:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running"}}


def spec(fallback: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"model": {"uri": "hf://org/model"}}
    if fallback is not None:
        out["fallback"] = fallback
    return out


def annotation(fallback: dict[str, Any]) -> str:
    parsed = FallbackSpec.from_dict(fallback)
    assert parsed is not None
    return parsed.annotation()


def test_the_annotation_is_one_canonical_text_in_the_chat_apis_file_format():
    text = annotation(FAQ)
    assert json.loads(text) == FAQ  # what the chat API parses: the CRD's own spelling
    reordered = {"breaker": {"resetSeconds": 10, "failures": 5}, "faq": FAQ["faq"]}
    assert annotation(reordered) == text  # equal specs, equal texts
    assert json.loads(annotation({"faq": []})) == {"breaker": {"failures": 3, "resetSeconds": 5}, "faq": []}
    assert ChatbotServiceSpec.from_dict(spec(None)).fallback is None


def test_a_fallback_change_is_no_new_revision():
    assert revision_hash(spec(FAQ)) == revision_hash(spec(None)) == revision_hash(spec({"faq": []}))


def test_the_plan_names_the_pods_whose_annotation_differs():
    text = annotation(FAQ)
    pods = [
        pod_facts(pod("a", annotation=text)),
        pod_facts(pod("b")),
        pod_facts(pod("c", annotation="old")),
        pod_facts(pod("d", deleting=True)),
        pod_facts(pod("e", track="canary")),
    ]
    assert plan_fallback(pods, text) == [
        PodAnnotation("b", text),
        PodAnnotation("c", text),
        PodAnnotation("e", text),
    ]
    assert plan_fallback(pods, None) == [PodAnnotation("a", None), PodAnnotation("c", None)]


def test_a_pod_is_quiet_without_the_annotation_and_passed_over_again_when_it_changes():
    assert pod_signature(pod("a")) == QUIET_POD  # fleets without spec.fallback: no pass per pod
    assert pod_signature(pod("a", annotation="x")) != pod_signature(pod("a", annotation="y"))


class Fleet:
    def __init__(self, fallback: dict[str, Any] | None) -> None:
        self.body = cbs_body(spec(fallback))
        self.snap = Snapshot(nodes=NODES)
        self.client = PodClient()
        self.pods: dict[str, dict[str, Any]] = {}

    def run(self) -> None:
        self.client.writes.clear()
        self.snap.pods = [pod_facts(p) for p in self.pods.values()]
        outcome = reconcile_pass(self.client, self.body, self.snap, World(), Settings(), NOW)
        self.body["status"] = outcome.status
        for name, _, patch in self.writes("pod"):  # the API server's merge patch
            meta = self.pods[name]["metadata"]
            meta["annotations"] = {k: v for k, v in {**meta["annotations"], **patch}.items() if v is not None}

    def writes(self, kind: str) -> list[Any]:
        return [w[1] for w in self.client.writes if w[0] == kind]

    def respec(self, fallback: dict[str, Any] | None) -> None:
        self.body["spec"] = spec(fallback)
        self.body["metadata"]["generation"] += 1


def test_a_pass_annotates_the_pods_once_and_a_change_reaches_them_without_a_release():
    fleet = Fleet(FAQ)
    fleet.run()  # creates the Deployment; no pod yet
    assert fleet.writes("pod") == []
    fleet.pods = {"bot-1": pod("bot-1"), "bot-2": pod("bot-2")}
    fleet.run()
    assert fleet.writes("pod") == [
        ("bot-1", {}, {api.ANNOTATION_FALLBACK: annotation(FAQ)}),
        ("bot-2", {}, {api.ANNOTATION_FALLBACK: annotation(FAQ)}),
    ]
    fleet.run()
    assert fleet.writes("pod") == [] and fleet.writes("apply") == []  # converged: nothing written

    changed = {**FAQ, "breaker": {"failures": 2, "resetSeconds": 5}}
    fleet.respec(changed)
    fleet.run()
    assert [w[2] for w in fleet.writes("pod")] == [{api.ANNOTATION_FALLBACK: annotation(changed)}] * 2
    assert fleet.writes("apply") == []  # no canary, no new template: no release, no pod restarted
    assert (fleet.body["status"].get("release") or {}).get("phase") in (None, "Idle")

    fleet.respec(None)
    fleet.run()
    assert [w[2] for w in fleet.writes("pod")] == [{api.ANNOTATION_FALLBACK: None}] * 2  # removed
    assert fleet.writes("apply") == []


def test_a_fleet_without_fallback_writes_no_pod():
    fleet = Fleet(None)
    fleet.pods = {"bot-1": pod("bot-1")}
    fleet.run()
    fleet.run()
    assert fleet.writes("pod") == []


def test_the_chat_api_reads_the_annotation_from_a_file_and_the_template_never_carries_it():
    fleet = Fleet(FAQ)
    fleet.body["spec"]["podMetadata"] = {"annotations": {api.ANNOTATION_FALLBACK: "mine", "team": "a"}}
    fleet.run()
    template = fleet.snap.children[("Deployment", "bot")]["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert api.ANNOTATION_FALLBACK not in annotations and annotations["team"] == "a"
    chat = next(c for c in template["spec"]["containers"] if c["name"] == "chat-api")
    assert {"name": "CHATFLEET_FALLBACK_FILE", "value": FALLBACK_FILE} in chat["env"]
    mount = next(m for m in chat["volumeMounts"] if m["name"] == "chat-settings")
    assert FALLBACK_FILE.startswith(mount["mountPath"] + "/") and mount["readOnly"]
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "chat-settings")
    (item,) = volume["downwardAPI"]["items"]
    assert FALLBACK_FILE.endswith("/" + item["path"])
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{api.ANNOTATION_FALLBACK}']"
