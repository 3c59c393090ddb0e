"""The operator process's own /metrics, scraped over HTTP while releases run on the local platform.

Test design: the session's operator process serves /metrics on a loopback port (conftest.py). The test
scrapes it before and after two releases of one ChatbotService: one promoted at once (a single 100 %
step without analysis), then one held at 50 % whose analysis cannot reach Prometheus (Error
measurements) until spec.rollout.abort rolls it back. The operator is shared with the other tests of
the session, so counters are asserted to have moved at least as much as this test made them move.
"""

from __future__ import annotations

from typing import Any

import pytest
from operator_it import chatbot, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

AT_ONCE = {"canary": {"steps": [{"weight": 100, "pauseSeconds": 0, "analysis": False}]}}
HELD = {"canary": {"steps": [{"weight": 50, "pauseSeconds": 0, "analysis": True}]}}
#: Nothing listens on port 9: every measurement is an Error (never a pass, never a rollback).
NO_PROMETHEUS = {
    "prometheusAddress": "http://127.0.0.1:9",
    "intervalSeconds": 2,
    "consecutiveErrorLimit": 100,
}


def sample(scraped: dict, name: str, **labels: str) -> float:
    """One sample of a scrape (0.0 when the label set was never counted)."""
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    """How much a sample grew between two scrapes."""
    return sample(after, name, **labels) - sample(before, name, **labels)


def last_result(kube, name: str) -> str | None:
    """The result of the newest releaseHistory entry (None when there is none)."""
    history = (kube.get("chatbotservice", name) or {}).get("status", {}).get("releaseHistory") or []
    return history[0].get("result") if history else None


def release_phase(kube, name: str) -> Any:
    """status.release.phase (None without a release)."""
    return ((kube.get("chatbotservice", name) or {}).get("status", {}).get("release") or {}).get("phase")


def test_a_release_moves_the_operators_own_metrics(kube, operator):
    base = {"scaling": {"replicas": 2}, "analysis": NO_PROMETHEUS}
    kube.apply(chatbot("bot", runtime={"maxNewTokens": 128}, rollout=AT_ONCE, **base))
    kube.wait_ready("bot")
    before = operator.scrape()

    # release 1: promoted at once
    kube.apply(chatbot("bot", runtime={"maxNewTokens": 200}, rollout=AT_ONCE, **base))
    assert wait_until(lambda: last_result(kube, "bot") == "Promoted", 60), kube.diagnose("bot")
    api = "chatfleet_operator_api_requests_total"

    def counted(now) -> bool:  # the status is visible before the pass that wrote it counts and posts events
        return (
            moved(before, now, "chatfleet_operator_releases_promoted_total", strategy="canary") >= 1
            and moved(before, now, api, verb="POST", kind="Event", code="201") >= 1
        )

    assert wait_until(lambda: counted(operator.scrape()), 10)
    promoted = operator.scrape()
    assert moved(before, promoted, "chatfleet_operator_releases_started_total", strategy="canary") >= 1
    assert moved(before, promoted, "chatfleet_operator_releases_promoted_total", strategy="canary") >= 1
    assert (
        moved(
            before, promoted, "chatfleet_operator_reconcile_passes_total", trigger="handler", result="success"
        )
        >= 1
    )
    assert moved(before, promoted, "chatfleet_operator_reconcile_duration_seconds_count") >= 1
    assert moved(before, promoted, api, verb="APPLY", kind="Deployment", code="200") >= 1
    assert moved(before, promoted, api, verb="PATCH", kind="ChatbotService/status", code="200") >= 1
    assert moved(before, promoted, api, verb="POST", kind="Event", code="201") >= 1  # ReleasePromoted

    # release 2: held at 50 %, measured in error (no Prometheus on port 9), then aborted: rolled back
    kube.apply(chatbot("bot", runtime={"maxNewTokens": 256}, rollout=HELD, **base))
    errors = "chatfleet_operator_analysis_measurements_total"
    assert wait_until(lambda: moved(promoted, operator.scrape(), errors, verdict="Error") >= 1, 90), (
        kube.diagnose("bot")
    )
    kube.apply(chatbot("bot", runtime={"maxNewTokens": 256}, rollout={**HELD, "abort": "*"}, **base))
    assert wait_until(lambda: release_phase(kube, "bot") == "RolledBack", 60), kube.diagnose("bot")
    rolled = "chatfleet_operator_releases_rolled_back_total"
    # the status is visible to the API before the pass that wrote it counts the transition
    assert wait_until(lambda: moved(promoted, operator.scrape(), rolled, strategy="canary") >= 1, 10)
    after = operator.scrape()
    assert moved(promoted, after, "chatfleet_operator_releases_started_total", strategy="canary") >= 1
    # no release is going on in this operator at the scrape's moment, or it is younger than a minute
    assert sample(after, "chatfleet_operator_oldest_pass_seconds") < 60
    # the passes above ran, so kopf's start-up gate is open (the last 10-s look may predate that by seconds)
    assert ("chatfleet_operator_handlers_held_seconds", ()) in after
    assert sample(after, "chatfleet_operator_handlers_held_seconds") < 60
    assert sample(after, "process_resident_memory_bytes") > 0
