"""Canary releases steered by hand from the plugin, end to end (the setting of test_release_canary.py:
real apiserver + kwok pods, real Prometheus scraping a trafficsim): abort, retry, undo, pause, resume,
promote, and the plugin's status tree and generated config while a release runs. A file of its own so that
the e2e layer's workers share the canary scenarios (pytest-xdist hands out whole files)."""

from __future__ import annotations

import pytest
from release_e2e import promoted_to, release, rolled_back, start

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.slow]


def test_manual_abort_from_the_plugin(bot, prometheus, traffic):
    start(bot, prometheus)
    new = release(bot)
    bot.wait(lambda r: r.release().get("revision") == new, 30, "release started")
    out = bot.plugin("abort", "bot")
    assert new in out
    bot.wait(rolled_back, 30, "abort")
    assert "aborted by spec.rollout.abort" in bot.status()["abortReason"]
    # CI waiting on the rollout hears that it failed (exit 1), at once
    out = bot.plugin("status", "bot", "--timeout", "30", expect=1)
    assert f"failed: revision {new} was rolled back" in out


def test_a_release_rolled_back_by_hand_is_retried_from_the_plugin_promoted_and_undone(
    bot, prometheus, traffic
):
    first = start(bot, prometheus)
    new = release(bot)
    bot.wait(lambda r: r.release().get("revision") == new, 30, "release started")
    bot.plugin("abort", "bot")
    bot.wait(rolled_back, 30, "abort")
    # retry starts the same revision again (the abort that rolled it back is cleared with it) and the
    # healthy canary is promoted; afterwards there is nothing to retry
    out = bot.plugin("retry", "bot")
    assert f"retry of revision {new} requested" in out
    rollout = bot.body()["spec"]["rollout"]
    assert rollout.get("retry") and "abort" not in rollout
    bot.wait(lambda r: r.release().get("phase") not in (None, "RolledBack"), 30, "the release started again")
    assert bot.release()["revision"] == new and bot.release()["retry"] == rollout["retry"]
    bot.wait(promoted_to(new), 150, "promotion after the retry")
    results = [h["result"] for h in bot.status()["releaseHistory"]]
    assert results[:2] == ["Promoted", "RolledBack"], results
    assert any("again after its rollback" in e["message"] for e in bot.events("ReleaseStarted"))
    bot.plugin("retry", "bot", expect=1)  # nothing rolled back: refused (exit 1), nothing written
    assert bot.body()["spec"]["rollout"]["retry"] == rollout["retry"]
    # undo puts back the spec fields of the revision the promotion replaced (kept in its history entry):
    # the operator releases v1 again, canary and analysis included
    assert bot.status()["releaseHistory"][0]["previous"]["revision"] == first
    out = bot.plugin("undo", "bot")
    assert f"undo to revision {first} requested" in out
    assert bot.body()["spec"]["model"]["revision"] == "v1"
    bot.wait(lambda r: r.release().get("revision") == first, 30, "the undo's release started")
    bot.wait(promoted_to(first), 150, "promotion of the undo")
    assert bot.status()["releaseHistory"][0]["previous"]["revision"] == new


def test_manual_promote_and_pause_from_the_plugin(bot, prometheus, traffic):
    start(
        bot,
        prometheus,
        rollout={
            "strategy": "canary",
            "canary": {"steps": [{"weight": 10, "pauseSeconds": 600}, {"weight": 50, "pauseSeconds": 600}]},
        },
    )
    new = release(bot)
    bot.plugin("pause", "bot")
    bot.wait(lambda r: r.cond("Reconciling").get("reason") == "ReleasePaused", 30, "paused")
    tree = bot.plugin("status", "bot")
    assert "Release: Progressing, step 1" in tree and "Analysis:" in tree
    config = bot.plugin("config", "bot")  # the generated Triton config of both tracks, from their templates
    assert "# deployment/bot (track stable" in config and "# deployment/bot-canary (track canary" in config
    assert config.count('name: "chat"') == 2
    bot.plugin("resume", "bot")
    bot.plugin("promote", "bot")  # skip the 10-minute pauses
    bot.wait(promoted_to(new), 60, "manual promotion")
