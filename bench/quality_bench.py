"""`make bench-quality`: the answer-quality gate on real pods: time to detection and false rollbacks.

Everything is real, as in `make bench-release-traffic`: the local Kubernetes, a real node running the
project's runtime image (Triton and the chat API on the tiny model, on CPU), Redis for the sessions,
Prometheus scraping the pods, and the operator. Users (`DialogueLoad`, USERS of them, five-turn streamed
dialogues through the Service) chat the whole time, so the HTTP metrics always have traffic.

Rows, one bot, in this order:
1. RELEASES (10) releases that change only resources (CPU, memory, shm in turn), gate on: each must be
   promoted; a rollback is a false rollback (goal 0).
2. A bad release, gate on: the chat template drops the roles (fluent, 200, fast, wrong). Timed from the
   first Ready canary pod (when its answers can first be judged) to the rollback, in seconds and in
   analysis intervals (goal: within 2 intervals of failureLimit 2).
3. The same bad release with Chatfleet's quality gate off: the product-off baseline (this operator judging
   HTTP metrics only: error rate and latency, the kind of checks an Argo Rollouts, Flagger or KServe user
   configures; those tools are not run here): promoted or rolled back, and when.

Then through the real gateway (Traefik serving the operator's HTTPRoute; the users move to it), shadow
traffic (spec.analysis.quality.shadow, 50 % mirrored, golden prompts off) against the golden-prompt gate:
4. a resource-only release with shadow on: promoted (the shadow phase passes, agreement 100 %);
5. the bad release with shadow on: rolled back in the shadow phase -- users answered by it: goal 0;
6. the bad release with the golden-prompt gate and no shadow: rolled back at its first weight (50 %) --
   the users it answered meanwhile are the baseline.
Every row counts the user turns the release's revision answered (each answer names its revision).

Writes bench-results/quality.json and prints the table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(REPO / "bench"))

from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES  # noqa: E402
from chatfleet_platform.load.dialogues import DialogueLoad  # noqa: E402
from chatfleet_platform.load.realpods import service_url  # noqa: E402
from chatfleet_platform.load.releasetraffic import Bot, ready_pods, rolled_back  # noqa: E402
from release_traffic_bench import Platform, table  # noqa: E402

USERS = int(os.environ.get("USERS", "8"))
RELEASES = int(os.environ.get("RELEASES", "10"))
INTERVAL = 10
OUT = REPO / "bench-results" / "quality.json"
ROLELESS_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
#: Resource-only changes, in turn: each a new revision that cannot change an answer.
RESOURCE_CHANGES: tuple[dict[str, str], ...] = (
    {"cpu": "300m"},
    {"memory": "3584Mi"},
    {"shmSize": "384Mi"},
    {"cpu": "250m"},
    {"memory": "3Gi"},
    {"shmSize": "256Mi"},
)
QUALITY = {
    "enabled": True,
    "maxTokens": 8,
    "prompts": [
        {"name": "refund", "prompt": "How long do refunds take?"},
        {"name": "hello", "prompt": "Hello! Who are you?"},
        {"name": "order", "prompt": "Where is my order 1234?"},
    ],
}


def say(msg: str) -> None:
    """Progress line."""
    print(f"[bench-quality] {msg}", flush=True)


def analysis(bot: Bot) -> dict[str, Any]:
    """status.release.analysis (empty without a release)."""
    return (bot.status().get("release") or {}).get("analysis") or {}


SHADOW = {"enabled": True, "percent": 50, "minRequests": 10, "comparisonsPerInterval": 5}


def release(
    bot: Bot, patch: dict[str, Any], what: str, load: DialogueLoad, timeout: float = 900
) -> dict[str, Any]:
    """Apply a spec change and follow its release to the end: promoted or rolled back, with the times
    from the change and from the first Ready canary pod, the analysis intervals judged, and the user
    turns the new revision answered until then."""
    before = bot.status().get("stableRevision")
    t0 = time.monotonic()
    bot.patch(patch)
    revision, already = "", 0
    canary_at: float | None = None
    verdicts: list[str] = []
    last_seen = None
    outcome = ""
    while time.monotonic() - t0 < timeout:
        if not revision:
            revision = str((bot.status().get("release") or {}).get("revision") or "")
            # a revision can come back (the same spec again): count only this release's turns
            already = load.revisions.get(revision, 0) if revision else 0
        if canary_at is None and ready_pods(bot, "canary") >= 1:
            canary_at = time.monotonic()
        a = analysis(bot)
        mark = (a.get("lastVerdict"), a.get("lastMeasuredAt"))
        if a.get("lastVerdict") and mark != last_seen:
            verdicts.append(str(a["lastVerdict"]))
            last_seen = mark
        if rolled_back(bot):
            outcome = "rolled back"
            break
        s = bot.status()
        if s.get("stableRevision") not in (None, before) and not s.get("release"):
            outcome = "promoted"
            break
        time.sleep(1)
    end = time.monotonic()
    row = {
        "release": what,
        "outcome": outcome or f"no end in {timeout:.0f}s",
        "seconds": round(end - t0),
        "from_canary_ready_s": round(end - canary_at) if canary_at is not None else None,
        "intervals_judged": len(verdicts),
        "verdicts": verdicts,
        "message": bot.cond("Stalled").get("message", "") if outcome == "rolled back" else "",
        "revision": revision,
        # until the end (a promoted revision answers everyone from then on)
        "user_turns_answered": load.revisions.get(revision, 0) - already if revision else None,
    }
    say(
        f"{what}: {row['outcome']} after {row['seconds']} s ({row['from_canary_ready_s']} s from a Ready canary)"
    )
    return row


def settle(bot: Bot, patch: dict[str, Any]) -> None:
    """After a rollback: the spec back to the stable revision; wait until no release is left."""
    bot.patch(patch)
    bot.wait(lambda: not bot.status().get("release") and bot.ready(), 300, "release cleared")


def main() -> int:
    """The rows, in one run of the platform; print the table and write the JSON."""
    platform = Platform()
    rows: list[dict[str, Any]] = []
    try:
        platform.up()
        bot = platform.bot(sticky=False, steps=(50, 100), pause_seconds=20)
        bot.patch({"analysis": {"intervalSeconds": INTERVAL, "quality": QUALITY}})
        url = service_url(platform.cluster, bot.ns, bot.name)
        load = DialogueLoad(url, concurrency=USERS, pin=False, sources=CLIENT_ADDRESSES, max_seconds=7200)
        load.start()
        bot.wait(lambda: load.summary()["ok"] >= 20, 300, "dialogues under way")
        for i in range(RELEASES):
            change = RESOURCE_CHANGES[i % len(RESOURCE_CHANGES)]
            rows.append(release(bot, {"resources": change}, f"resources {i + 1}: {change}", load))
            if rows[-1]["outcome"] != "promoted":
                settle(bot, {"resources": RESOURCE_CHANGES[(i - 1) % len(RESOURCE_CHANGES)]})
        bad = {"model": {"chatTemplate": ROLELESS_TEMPLATE}}
        rows.append(release(bot, bad, "broken chat template, quality gate on", load))
        if rows[-1]["outcome"] == "rolled back":
            settle(bot, {"model": {"chatTemplate": None}})
        bot.patch({"analysis": {"quality": {"enabled": False}}})
        rows.append(release(bot, bad, "broken chat template, quality gate off (HTTP metrics only)", load))
        # the template back (a release, HTTP metrics only), then the users move to the gateway
        release(bot, {"model": {"chatTemplate": None}}, "template restored", load)
        summary = load.stop()
        gateway = platform.gateway_up()
        bot.wait(
            lambda: bot.kubectl("get", "httproute", bot.name, check=False).returncode == 0, 60, "HTTPRoute"
        )
        load = DialogueLoad(gateway.url, concurrency=USERS, pin=False, max_seconds=7200)
        load.start()
        bot.wait(lambda: load.summary()["ok"] >= 20, 300, "dialogues through the gateway")
        bot.patch({"analysis": {"quality": {"enabled": False, "shadow": SHADOW}}})
        rows.append(release(bot, {"resources": RESOURCE_CHANGES[0]}, "gateway: resources, shadow on", load))
        rows.append(release(bot, bad, "gateway: broken chat template, shadow on", load))
        if rows[-1]["outcome"] == "rolled back":
            settle(bot, {"model": {"chatTemplate": None}})
        bot.patch({"analysis": {"quality": {**QUALITY, "shadow": {"enabled": False}}}})
        rows.append(release(bot, bad, "gateway: broken chat template, golden prompts, no shadow", load))
        gateway_summary = load.stop()
    finally:
        platform.down()
    healthy = [r for r in rows if r["release"].startswith("resources")]
    result = {
        "users": USERS,
        "interval_seconds": INTERVAL,
        "failure_limit": 2,
        "rows": rows,
        "false_rollbacks": sum(r["outcome"] != "promoted" for r in healthy),
        "healthy_releases": len(healthy),
        "load": summary,
        "gateway_load": gateway_summary,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, default=str))
    print()
    print(
        table(
            rows,
            [
                ("release", "release"),
                ("outcome", "outcome"),
                ("seconds", "seconds"),
                ("from_canary_ready_s", "from Ready canary (s)"),
                ("intervals_judged", "intervals judged"),
                ("user_turns_answered", "user turns it answered"),
            ],
        )
    )
    print(
        f"\nfalse rollbacks: {result['false_rollbacks']} of {len(healthy)} resource-only releases; "
        f"users: {summary['turns']} turns, {summary['ok']} ok; through the gateway "
        f"{gateway_summary['turns']} turns, {gateway_summary['ok']} ok"
    )
    print(f"written: {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
