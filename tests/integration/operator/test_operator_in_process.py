"""The reconciler in-process against the real local cluster, for what an operator process cannot show.

Test design: these tests drive `Controller.attempt` (one pass and its retry) with the real API module
`kube.py`, in a solo-* namespace no operator process watches. A failing pass is injected by a client
whose apply raises; everything else (status writes, events) is the real API server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from chatfleet_operator import kube
from chatfleet_operator.controller import Controller, Retry
from chatfleet_operator.settings import Settings
from operator_it import Kube, chatbot

pytestmark = [pytest.mark.cluster]


@pytest.fixture
def api(chatfleet_crd, solo_namespace) -> Kube:
    """kubectl helpers in the solo namespace, with kube.py pointed at the session cluster."""
    kube.configure(kubeconfig=str(chatfleet_crd.kubeconfig))
    return Kube(chatfleet_crd, solo_namespace)


class InjectedFailure:
    """The real API module, except that apply raises (as a bug in a pass would)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(kube, name)

    def apply(self, manifest: Any) -> dict[str, Any]:
        raise RuntimeError("injected failure\nsecond line")


def attempt(controller: Controller, api: Kube) -> Retry | None:
    """One pass on the object as the API server has it; the retry it calls for."""
    body = api.get("chatbotservice", "bot")
    return asyncio.run(controller.attempt((body["metadata"]["namespace"], "bot"), body))


def test_a_pass_that_raises_shows_in_status_and_one_event(api):
    api.apply(chatbot("bot", runtime={"sessions": {"redis": {"secretName": "redis"}}}))
    failing = Controller(Settings(), InjectedFailure())
    delays = []
    for _ in range(3):
        retry = attempt(failing, api)
        assert retry is not None and "injected failure" in retry.why
        delays.append(retry.delay)
    assert delays == [5, 10, 20]  # backoff, never a hot loop
    status = api.get("chatbotservice", "bot")["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "ReconcileError")
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("True", "ReconcileError")
    assert conds["Stalled"]["message"].endswith("RuntimeError: injected failure")
    assert status["observedGeneration"] == 0  # generation 1 was never reconciled: the CRD's default
    warnings = [e for e in api.events("bot") if e["reason"] == "ReconcileError"]
    assert [e["type"] for e in warnings] == ["Warning"], warnings  # one event for three failed passes

    # The bug is gone: the next pass reconciles generation 1 and clears the condition.
    attempt(Controller(Settings(), kube), api)
    status = api.get("chatbotservice", "bot")["status"]
    assert status["observedGeneration"] == 1
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Stalled"] != "ReconcileError"


def test_a_pass_never_asks_for_a_secret(api, monkeypatch):
    """A spec naming Secrets (Redis URL, model credentials, image pull) is reconciled without one request
    about a Secret: the pods name them and the kubelet reads them (the chart grants no access to Secrets)."""
    paths: list[str] = []
    request = kube.request

    def recorded(method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        paths.append(f"{method} {path}")
        return request(method, path, *args, **kwargs)

    monkeypatch.setattr(kube, "request", recorded)
    api.apply(
        chatbot(
            "bot",
            model={"uri": "hf://org/tiny", "credentialsSecret": "hub"},
            runtime={"sessions": {"redis": {"secretName": "redis"}}, "imagePullSecrets": ["regcred"]},
        )
    )
    attempt(Controller(Settings(), kube), api)  # (no node index here: it may report NoMatchingGPUNodes)
    assert any("/deployments/bot" in p for p in paths), paths  # the pass did run and apply
    assert not [p for p in paths if "/secrets" in p], paths
    dep = api.get("deployment", "bot")
    assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_the_image_a_spec_leaves_out_follows_the_operator_through_a_release(api):
    """The CRD no longer writes a default image into the object; the operator's default builds the pods,
    and a new default (an operator upgrade) is a new revision, rolled out as a spec change is. An object
    stored with the old CRD's default follows too; one naming its own image does not."""
    from dataclasses import replace

    from chatfleet_operator.defaults import IMAGE, LEGACY_STORED, ClusterDefaults
    from chatfleet_operator.settings import RuntimeSettings

    def operator(image: str) -> Controller:
        runtime = replace(RuntimeSettings(), defaults=replace(ClusterDefaults(), runtime_image=image))
        return Controller(replace(Settings(), runtime=runtime), kube)

    def images(name: str) -> set[str]:
        dep = api.get("deployment", name)
        return {c["image"] for c in dep["spec"]["template"]["spec"]["containers"]} if dep else set()

    api.apply(chatbot("bot"))
    api.apply(chatbot("legacy", runtime={"image": LEGACY_STORED[IMAGE]}))
    api.apply(chatbot("pinned", runtime={"image": "registry.example/mine:1"}))
    assert "image" not in (api.get("chatbotservice", "bot")["spec"].get("runtime") or {})  # nothing stored
    for name in ("bot", "legacy", "pinned"):
        body = api.get("chatbotservice", name)
        asyncio.run(operator("registry.example/rt:1").attempt((body["metadata"]["namespace"], name), body))
    assert images("bot") == images("legacy") == {"registry.example/rt:1"}
    assert images("pinned") == {"registry.example/mine:1"}
    first = {name: api.get("chatbotservice", name)["status"]["updateRevision"] for name in ("bot", "pinned")}

    for name in ("bot", "pinned"):  # the operator upgraded, with a new default image
        body = api.get("chatbotservice", name)
        asyncio.run(operator("registry.example/rt:2").attempt((body["metadata"]["namespace"], name), body))
    now = {name: api.get("chatbotservice", name)["status"]["updateRevision"] for name in ("bot", "pinned")}
    # a new revision, rolled out as any spec change is (here no revision was stable yet, so in place;
    # with a stable one, a release: tests/unit/operator/test_operator_defaults.py, the release tests)
    assert now["bot"] != first["bot"] and images("bot") | images("bot-canary") >= {"registry.example/rt:2"}
    assert now["pinned"] == first["pinned"] and images("pinned") == {"registry.example/mine:1"}
