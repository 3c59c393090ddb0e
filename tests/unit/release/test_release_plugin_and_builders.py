"""The plugin's tree and history rendering, and the release builders (HTTPRoute, track Services)."""

from __future__ import annotations

from datetime import UTC, datetime

from chatfleet_operator.builders import build_deployment, build_service
from chatfleet_operator.builders.httproute import REVISION_HEADER, build_httproute
from chatfleet_operator.plugin import render_config, render_history, render_tree
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

REF = ObjectRef("ns", "bot", "uid-1")
NOW = datetime(2026, 11, 21, 10, 0, 30, tzinfo=UTC)


def body() -> dict:
    return {
        "metadata": {"namespace": "ns", "name": "bot"},
        "spec": {"rollout": {"canary": {"steps": [{"weight": 20}, {"weight": 50}, {"weight": 100}]}}},
        "status": {
            "phase": "Progressing",
            "conditions": [{"type": "Ready", "status": "False", "reason": "Releasing"}],
            "stableRevision": "aaa",
            "updateRevision": "bbb",
            "canaryWeight": 50,
            "release": {
                "revision": "bbb",
                "strategy": "canary",
                "phase": "Progressing",
                "traffic": "ReplicaRatio",
                "capacity": "Surge",
                "stepIndex": 1,
                "effectiveWeight": 50,
                "startedAt": "2026-11-21T10:00:00Z",
                "message": "Step 2/3: weight 50%, 8s of pause left, then a passing analysis",
                "analysis": {
                    "checks": 4,
                    "failed": 1,
                    "errors": 0,
                    "inconclusive": 1,
                    "lastVerdict": "Successful",
                    "lastMeasuredAt": "2026-11-21T10:00:27Z",
                    "figures": [
                        {
                            "metric": "error rate",
                            "canary": 0.4,
                            "stable": 0.1,
                            "limit": 1,
                            "unit": "%",
                            "ok": True,
                        }
                    ],
                },
            },
            "releaseHistory": [
                {
                    "revision": "zzz",
                    "result": "RolledBack",
                    "at": "2026-11-21T09:00:00Z",
                    "message": "error rate 4.2% > 1%",
                }
            ],
        },
    }


def pod(track: str, rev: str, ready: bool) -> dict:
    return {
        "metadata": {"labels": {"chatfleet.io/track": track, "chatfleet.io/revision": rev}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_tree_shows_step_weights_and_figures():
    text = render_tree(
        body(), [pod("stable", "aaa", True), pod("canary", "bbb", True), pod("canary", "bbb", False)], NOW
    )
    assert "stable aaa -> bbb (canary, traffic ReplicaRatio, GPUs Surge)" in text
    assert "20% done, 50% now, 100% next" in text
    assert "weight 50% (effective 50% by replicas)" in text
    assert "[ok ] error rate 0.4% <= 1% (stable 0.1%)" in text
    assert "4 checks, 1 failed, 0 errors, 1 inconclusive; last Successful 3s ago" in text
    assert "canary bbb: 1/2 Ready" in text and "stable aaa: 1/1 Ready" in text


def test_tree_spells_a_failed_floor_and_a_figure_without_data_as_the_analysis_does():
    # a floor (tokens/s must not fall below 0.8x stable's) failed: the canary is under it, not over it
    floor = {
        "metric": "tokens/s",
        "canary": 30.0,
        "stable": 50.0,
        "limit": 40.0,
        "unit": "tok/s",
        "ok": False,
    }
    empty = {"metric": "TTFT P95", "unit": "ms", "ok": True}
    figured = body()
    figured["status"]["release"]["analysis"]["figures"] = [floor, empty]
    text = render_tree(figured, [pod("stable", "aaa", True), pod("canary", "bbb", True)], NOW)
    assert "[BAD] tokens/s 30tok/s < 40tok/s (stable 50tok/s)" in text
    assert "[ok ] TTFT P95: no data" in text


def test_tree_shows_the_shadow_phase_before_the_steps():
    shadowing = body()
    rel = shadowing["status"]["release"]
    rel.update(phase="Shadowing", stepIndex=0, shadowStartedAt="2026-11-21T10:00:00Z")
    assert "Steps: shadow now, 20% next, 50% next, 100% next" in render_tree(shadowing, [], NOW)
    rel.update(phase="Progressing", stepIndex=1, shadowPassedAt="2026-11-21T10:00:20Z")
    assert "Steps: shadow done, 20% done, 50% now, 100% next" in render_tree(shadowing, [], NOW)
    rel.update(phase="RolledBack", stepIndex=0, shadowPassedAt=None)
    del rel["shadowPassedAt"]
    assert "Steps: shadow rolled back, 20% -, 50% -, 100% -" in render_tree(shadowing, [], NOW)
    # a release without a shadow phase shows none
    assert "shadow" not in render_tree(body(), [], NOW).split("Steps:")[1].splitlines()[0]


def test_history_table():
    text = render_history(body())
    assert text.splitlines()[1].split()[:2] == ["zzz", "RolledBack"]
    assert render_history({"status": {}}) == "no releases yet"


def test_httproute_weights_without_pins():
    route = build_httproute(REF, stable_weight=80, canary_weight=20, gateway_name="gw")
    rules = route["spec"]["rules"]
    assert rules == [
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "backendRefs": [
                {"name": "bot", "port": 8080, "weight": 80},
                {"name": "bot-canary", "port": 8080, "weight": 20},
            ],
        }
    ]
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}
    ]


def test_httproute_hostnames_are_the_specs_and_absent_when_unset():
    assert (
        "hostnames" not in build_httproute(REF, stable_weight=100, canary_weight=0, gateway_name="gw")["spec"]
    )
    route = build_httproute(
        REF, stable_weight=100, canary_weight=0, gateway_name="gw", hostnames=("chat.example.com",)
    )
    assert route["spec"]["hostnames"] == ["chat.example.com"]


def test_httproute_pins_each_revision_to_its_service_before_the_weights():
    route = build_httproute(
        REF,
        stable_weight=0,
        canary_weight=100,
        gateway_name="gw",
        gateway_namespace="edge",
        pins={"b2": "canary", "a1": "stable"},
    )
    rules = route["spec"]["rules"]
    pinned = [
        (
            r["matches"][0]["headers"][0]["name"],
            r["matches"][0]["headers"][0]["value"],
            r["backendRefs"][0]["name"],
        )
        for r in rules[:-1]
    ]
    assert pinned == [(REVISION_HEADER, "a1", "bot"), (REVISION_HEADER, "b2", "bot-canary")]
    assert REVISION_HEADER == "x-chatfleet-revision"
    assert rules[-1]["backendRefs"][1] == {"name": "bot-canary", "port": 8080, "weight": 100}
    assert route["spec"]["parentRefs"][0]["namespace"] == "edge"


def test_selector_service_affinity():
    svc = build_service(REF, "bot", {"chatfleet.io/service": "bot"}, affinity_seconds=3600)
    assert svc["spec"]["selector"] == {"chatfleet.io/service": "bot"}
    assert svc["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] == 3600


def test_deployment_keeps_an_observed_template_and_builds_the_tracks_config():
    """Built once per track: the stable one on its observed template (old revision and its config kept),
    the canary's from the spec, its config in its own template."""
    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}})
    old_config = {"triton.chatfleet.io/chat.config.pbtxt": "old config"}
    observed = {
        "spec": {
            "template": {
                "metadata": {"labels": {"chatfleet.io/revision": "old"}, "annotations": old_config},
                "spec": {},
            }
        }
    }
    template = observed["spec"]["template"]
    kept = build_deployment(REF, spec, PodSettings(), revision="old", replicas=3, template=template)
    assert kept["spec"]["replicas"] == 3 and kept["metadata"]["labels"]["chatfleet.io/revision"] == "old"
    assert kept["spec"]["template"]["metadata"]["labels"]["chatfleet.io/revision"] == "old"
    assert kept["spec"]["template"]["metadata"]["annotations"] == old_config
    moved = build_deployment(REF, spec, PodSettings(), revision="new", track="canary")
    config = moved["spec"]["template"]["metadata"]["annotations"]["triton.chatfleet.io/chat.config.pbtxt"]
    assert config.startswith('name: "chat"')


def test_config_shows_each_tracks_triton_config_from_its_pod_template():
    """`kubectl chatbot config NAME`: the config.pbtxt files the pods get, stable first, then the canary."""
    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}, "runtime": {"maxNewTokens": 77}})
    canary = build_deployment(REF, spec, PodSettings(), revision="new", track="canary")
    stable = build_deployment(
        REF, ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}}), PodSettings(), revision="old"
    )
    text = render_config([canary, stable])
    stable_at = text.index("# deployment/bot (track stable, revision old): chat.config.pbtxt")
    canary_at = text.index("# deployment/bot-canary (track canary, revision new): chat.config.pbtxt")
    assert stable_at < canary_at and '"77"' in text[canary_at:] and '"77"' not in text[:canary_at]
    assert text.count(".config.pbtxt") == 2  # one model per track: chat
    assert render_config([]) == "no Triton config found (no Deployment yet?)"
