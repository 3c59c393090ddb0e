"""The Argo CD health check (Lua) against sample ChatbotServices, and the status shape kstatus reads.

Test design: the script runs in Lua 5.1 (lupa.lua51), the dialect of Argo CD's gopher-lua, the way Argo
CD runs it: a global `obj` holding the object, a returned table with status and message. The "ready"
sample is a status the operator wrote on the local platform; the others vary it one fact at a time.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from chart_helpers import CHART

LUA = (CHART / "files" / "argocd-health.lua").read_text()


def cond(type_: str, status: str, reason: str, message: str = "", generation: int = 1) -> dict[str, Any]:
    """A metav1.Condition."""
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": "2026-11-21T09:55:38Z",
    }


READY: dict[str, Any] = {
    "apiVersion": "chatfleet.io/v1alpha1",
    "kind": "ChatbotService",
    "metadata": {"name": "bot", "namespace": "team-a", "generation": 1},
    "spec": {"model": {"hostPath": "/models/tiny"}},
    "status": {
        "observedGeneration": 1,
        "phase": "Ready",
        "conditions": [
            cond("Ready", "True", "Ready", "Revision cb7321feac serving: 1/1 replicas available"),
            cond("Reconciling", "False", "Reconciled", "Revision cb7321feac serving: 1/1 replicas available"),
            cond("Stalled", "False", "Reconciled", "No problem found"),
            cond("Degraded", "False", "Healthy", "No pod is restarting"),
        ],
        "replicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
        "canaryWeight": 0,
        "stableRevision": "cb7321feac",
        "updateRevision": "cb7321feac",
    },
}


def variant(generation: int | None = None, status: dict[str, Any] | None = None, **conds: tuple) -> dict:
    """READY with some facts changed: conditions by type (status, reason, message), status fields merged."""
    obj = copy.deepcopy(READY)
    if generation is not None:
        obj["metadata"]["generation"] = generation
    for type_, (st, reason, message) in conds.items():
        obj["status"]["conditions"] = [c for c in obj["status"]["conditions"] if c["type"] != type_]
        obj["status"]["conditions"].append(cond(type_, st, reason, message))
    obj["status"].update(status or {})
    return obj


def health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the health script like Argo CD does."""
    from lupa.lua51 import LuaRuntime

    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(LUA)
    return {"status": result["status"], "message": result["message"]}


CASES = [
    pytest.param(READY, "Healthy", "Ready: Revision cb7321feac serving", id="ready"),
    pytest.param(
        {k: v for k, v in READY.items() if k != "status"},
        "Progressing",
        "Waiting for the operator",
        id="no-status",
    ),
    pytest.param(
        {
            **{k: v for k, v in READY.items() if k != "status"},
            "status": {"observedGeneration": 0, "phase": "Pending"},
        },
        "Progressing",
        "status of generation 1",
        id="the-crds-default-status",
    ),
    pytest.param(
        variant(generation=2), "Progressing", "status of generation 2", id="spec-change-not-observed"
    ),
    pytest.param(
        variant(
            Stalled=("True", "NoMatchingGPUNodes", "No node has nvidia.com/gpu.product=H100"),
            Ready=("False", "NoMatchingGPUNodes", "No node has nvidia.com/gpu.product=H100"),
        ),
        "Degraded",
        "NoMatchingGPUNodes: No node has",
        id="stalled",
    ),
    pytest.param(
        variant(Degraded=("True", "CrashLoopBackOff", "Pod bot-1 restarts: CrashLoopBackOff")),
        "Degraded",
        "CrashLoopBackOff: Pod bot-1",
        id="crash-looping",
    ),
    pytest.param(
        variant(
            status={
                "updateRevision": "9f00aa11bb",
                "abortReason": "errorRatePercent 3.2 > 1 (failed 3 > failureLimit 2)",
            }
        ),
        "Degraded",
        "Release rolled back: errorRatePercent 3.2 > 1",
        id="rolled-back",
    ),
    pytest.param(
        variant(status={"abortReason": "latency too high"}),
        "Healthy",
        "Ready",
        id="rolled-back-then-spec-reverted",
    ),
    pytest.param(
        variant(
            Reconciling=("True", "RollingOut", "Canary 9f00aa11bb at step 1"),
            status={"canaryRevision": "9f00aa11bb", "canaryWeight": 10, "updateRevision": "9f00aa11bb"},
        ),
        "Progressing",
        "Canary 9f00aa11bb at 10% of traffic",
        id="canary-in-progress",
    ),
    pytest.param(
        {
            **variant(
                Reconciling=("True", "RollingOut", "Canary 9f00aa11bb at step 1"),
                status={"canaryRevision": "9f00aa11bb", "canaryWeight": 50, "updateRevision": "9f00aa11bb"},
            ),
            "spec": {"model": {"hostPath": "/models/tiny"}, "rollout": {"paused": True}},
        },
        "Suspended",
        "Release paused",
        id="release-paused",
    ),
    pytest.param(
        {**READY, "spec": {"model": {"hostPath": "/models/tiny"}, "rollout": {"paused": True}}},
        "Healthy",
        "Ready",
        id="paused-with-no-release-is-healthy",
    ),
    pytest.param(
        variant(
            Ready=("False", "WaitingForPods", "0/1 replicas available"),
            Reconciling=("True", "RollingOut", "Revision cb7321feac: 0/1 replicas available"),
        ),
        "Progressing",
        "RollingOut: Revision cb7321feac",
        id="rolling-out",
    ),
    pytest.param(
        variant(Ready=("False", "WaitingForPods", "0/1 replicas available")),
        "Progressing",
        "WaitingForPods: 0/1",
        id="waiting-for-pods",
    ),
    pytest.param(
        variant(status={"conditions": []}),
        "Progressing",
        "",
        id="no-conditions-yet",
    ),
]


@pytest.mark.parametrize(("obj", "status", "message"), CASES)
def test_argocd_health(obj: dict[str, Any], status: str, message: str) -> None:
    result = health(obj)
    assert result["status"] == status, result
    assert message in result["message"], result


def test_health_script_is_valid_lua_51_without_globals_leaking() -> None:
    from lupa.lua51 import LuaRuntime

    lua = LuaRuntime()
    lua.globals().obj = lua.table_from(READY, recursive=True)
    before = set(lua.globals().keys())
    lua.execute(LUA)
    assert set(lua.globals().keys()) == before, "the script must keep its names local"


def test_status_follows_kstatus_conventions() -> None:
    """What Flux's kstatus reads: observedGeneration, and Ready/Reconciling/Stalled conditions as metav1.Condition."""
    status = READY["status"]
    assert isinstance(status["observedGeneration"], int)
    types = {c["type"] for c in status["conditions"]}
    assert {"Ready", "Reconciling", "Stalled"} <= types
    for c in status["conditions"]:
        assert {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"} <= c.keys()
        assert c["status"] in ("True", "False", "Unknown")
