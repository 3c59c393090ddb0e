"""`kubectl chatbot undo`: the spec of the revision a promotion replaced is kept, and put back.

Test design: full passes through a canary release with the release tests' simulated cluster (every
Deployment rolls out at once, a Prometheus that passes the analysis); the plugin's `undo` reads the object
and its merge patch is applied to the spec as the API server would, so the next passes release the old
revision back. The refusals are checked on hand-made objects at the plugin's one write (`patch_spec`).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from chatfleet_operator import plugin
from test_operator_metrics import Cluster, FakePrometheus, spec, stable

STEPS = [{"weight": 50, "pauseSeconds": 10}, {"weight": 100, "pauseSeconds": 0, "analysis": False}]


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def promoted(revision: str):
    def done(status: dict[str, Any]) -> bool:
        history = status.get("releaseHistory") or [{}]
        return (
            stable(status) and history[0].get("result") == "Promoted" and history[0]["revision"] == revision
        )

    return done


def test_a_promotion_keeps_the_spec_it_replaced_and_undo_releases_it_back(monkeypatch, capsys):
    cluster = Cluster(spec(STEPS), FakePrometheus(error_rate=0.0))
    cluster.run_until(stable)
    status = cluster.body["status"]
    first = status["stableRevision"]
    assert status["stableSpec"] == {"model": {"uri": "hf://org/model", "revision": "v1"}}

    cluster.release("v2")
    cluster.tick()
    status = cluster.body["status"]
    second = status["updateRevision"]
    assert status["stableRevision"] == first and status["stableSpec"]["model"]["revision"] == "v1"
    cluster.run_until(promoted(second))
    status = cluster.body["status"]
    assert status["stableSpec"] == {"model": {"uri": "hf://org/model", "revision": "v2"}}
    assert status["releaseHistory"][0]["previous"] == {
        "revision": first,
        "spec": {"model": {"uri": "hf://org/model", "revision": "v1"}},
    }

    patches: list[dict[str, Any]] = []
    monkeypatch.setattr(plugin, "patch_spec", lambda ns, name, fields: patches.append(fields))
    assert plugin.undo("ns", "bot", cluster.body) == 0
    assert f"undo to revision {first} requested" in capsys.readouterr().out
    assert patches == [
        {
            "model": {"uri": "hf://org/model", "revision": "v1"},
            "runtime": None,
            "resources": None,
            "podMetadata": None,
        }
    ]
    merge(cluster.body["spec"], patches[0])
    cluster.body["metadata"]["generation"] += 1
    cluster.tick()
    assert cluster.body["status"]["release"]["revision"] == first  # a release, canary and analysis
    cluster.run_until(promoted(first))
    status = cluster.body["status"]
    assert status["stableRevision"] == first
    assert status["releaseHistory"][0]["previous"]["revision"] == second  # undo can be undone
    assert status["releaseHistory"][1]["previous"]["revision"] == first


def body(status: dict[str, Any], spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "bot"},
        "spec": spec or {"model": {"uri": "hf://o/m"}},
        "status": status,
    }


def promotion(revision: str, previous: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"revision": revision, "result": "Promoted", "previous": {"revision": previous, "spec": spec}}


V1 = {"model": {"uri": "hf://o/m", "revision": "v1"}}
V2 = {"model": {"uri": "hf://o/m", "revision": "v2"}}
V3 = {"model": {"uri": "hf://o/m", "revision": "v3"}}


@pytest.mark.parametrize(
    "status, spec, to, error",
    [
        pytest.param(
            {"stableRevision": "r2", "release": {"revision": "r3", "phase": "Progressing"}},
            V3,
            None,
            "a release is in progress on ns/bot: abort it instead",
            id="during-a-release",
        ),
        pytest.param(
            {"stableRevision": "r1"},
            V1,
            None,
            "no kept spec of the revision before the stable one",
            id="no-history",
        ),
        pytest.param(
            {"stableRevision": "r2", "releaseHistory": [promotion("r2", "r1", V1)]},
            V2,
            "r0",
            "no kept spec of revision r0",
            id="unknown-revision",
        ),
        pytest.param(
            {"stableRevision": "r2", "releaseHistory": [promotion("r2", "r1", V2)]},
            V2,
            None,
            "already holds revision r1's fields",
            id="a-release-of-the-operators-defaults",
        ),
    ],
)
def test_undo_refuses_what_it_cannot_put_back(monkeypatch, capsys, status, spec, to, error):
    monkeypatch.setattr(plugin, "patch_spec", lambda *a: pytest.fail("refused: nothing patched"))
    assert plugin.undo("ns", "bot", body(status, spec), to) == 1
    assert error in capsys.readouterr().err


def test_undo_to_an_older_revision_and_an_abort_of_it_cleared(monkeypatch):
    patches: list[dict[str, Any]] = []
    monkeypatch.setattr(plugin, "patch_spec", lambda ns, name, fields: patches.append(fields))
    history = [promotion("r3", "r2", V2), promotion("r2", "r1", V1)]
    spec = {**V3, "rollout": {"abort": "r1"}}
    assert (
        plugin.undo("ns", "bot", body({"stableRevision": "r3", "releaseHistory": history}, spec), "r1") == 0
    )
    assert patches[0]["model"] == V1["model"] and patches[0]["rollout"] == {"abort": None}
    assert plugin.main  # the command line names it
    assert "undo" in plugin.__doc__
