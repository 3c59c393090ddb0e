"""`make bench-chaos-upgrades` (the second part of `make bench-chaos`): operator upgrades under streamed
dialogues on real pods, with the upgrade wave beside the same run without it.

Everything is real: the local Kubernetes, a real node (kubelet, containerd, runc) running the project's
runtime image (Triton + the chat API on the tiny model, on CPU), Redis for the sessions, and the operator
itself in a pod on that node, installed by its Helm chart (`charts/chatfleet-operator`) and upgraded by
`helm upgrade`. FLEETS (3) ChatbotServices of one pod each serve USERS (32) users holding five-turn
streamed dialogues through their Services (`DialogueLoad`, split over the fleets).

The operator's builds are images of three versions of its code: each is built from the operator's
sources with its defaults in `chatfleet_operator/settings.py` changed (`ImageBuilder.build_edited_into`:
the operator's Dockerfile on the same base and layer cache, as a release of changed code is built, then
imported into the real node under its own tag). What tells them apart is what every fleet's pod template
gets from them, with the same revision (what a new annotation, env var or probe in the builders does):
the chat API's CPU, build A 150m, build B 200m. The bad build (C) also gives the chat API 24Mi of memory:
its chat-api container is OOM-killed as it starts, again and again, as a build with a broken container
would be. Each upgrade is `helm upgrade --reuse-values` naming the
build's image tag (and the row's `operator.upgradeWave`): the chart's Deployment replaces the operator's
pod (Recreate: one operator at a time), and the new pod's passes carry the new template to the fleets.
Each row runs, under the same load:

1. upgrade A -> B, waited for until every fleet runs B's template, rolled out, none held;
2. upgrade B -> A, the same;
3. the bad build C, watched for BAD_WATCH_SECONDS (or until the wave halts, plus HALT_WATCH_SECONDS);
4. back to A (the chart rolled back), waited for as in 1.

Rows: `operator.upgradeWave=1` (Chatfleet: one fleet at a time, a failing one halts the wave) and
`operator.upgradeWave=0` (the baseline: no wave, every fleet at once, as any operator without one, or a
chart of plain Deployments, rolls them). Counted per row: the most fleets rolling a new template at the
same moment (sampled every 0.5 s), how many fleets the bad build reached, each upgrade's seconds (from
`helm upgrade`), and what the users saw: turns, streams cut, non-2xx, turns with no answer, lost
histories, and the turns' p50/p99 seconds during the upgrades beside the quiet half minute before them.

Writes bench-results/chaos-upgrades.json and prints the table.
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

from chatfleet_platform.addons.operatorchart import OperatorChart, image_values, real_node_values  # noqa: E402
from chatfleet_platform.cluster import images  # noqa: E402
from chatfleet_platform.cluster.realnode import CLIENT_ADDRESSES  # noqa: E402
from chatfleet_platform.load.dialogues import DialogueLoad  # noqa: E402
from chatfleet_platform.load.realpods import service_url  # noqa: E402
from chatfleet_platform.load.releasetraffic import Bot  # noqa: E402
from chatfleet_platform.load.upgrades import WaveSample, sample  # noqa: E402
from release_traffic_bench import Platform, table  # noqa: E402

FLEETS = int(os.environ.get("FLEETS", "3"))
USERS = int(os.environ.get("USERS", "32"))
QUIET_SECONDS = float(os.environ.get("QUIET_SECONDS", "30"))
BAD_WATCH_SECONDS = 120.0
HALT_WATCH_SECONDS = 45.0
UPGRADE_TIMEOUT = 900.0
#: The builds: (the chat API's CPU, its memory or None for the default), each its own version of the
#: operator's code. A and B are good; C's chat-api container is OOM-killed as it starts.
BUILDS: dict[str, tuple[str, str | None]] = {"A": ("150m", None), "B": ("200m", None), "C": ("160m", "24Mi")}
#: Where the builds' code differs: the pod settings' defaults.
SETTINGS = "operator/chatfleet_operator/settings.py"
#: The namespace of the chart's release.
SYSTEM = "chatfleet-system"
#: Smaller CPU requests than the real node's usual 250m (limits are not enforced there), so that every
#: fleet's surge pod fits the node's 2 cores at once in the baseline: 2 x FLEETS pods.
RESOURCES = {"cpu": "100m", "memory": "2Gi"}
THINK_SECONDS = (1.0, 3.0)
OUT = REPO / "bench-results" / "chaos-upgrades.json"


def say(msg: str) -> None:
    """Progress line."""
    print(f"[bench-chaos-upgrades] {msg}", flush=True)


def split(total: int, parts: int) -> list[int]:
    """`total` users over `parts` fleets, as evenly as whole numbers go (e.g. 32 over 3 -> 11, 11, 10)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def build_ref(build: str) -> str:
    """The image of `build`: the built operator image's repository and tag, `-build-<name>` after it."""
    return f"{images.read_refs()['operator']['ref']}-build-{build.lower()}"


def build_edits(build: str) -> list[images.Edit]:
    """How `build`'s code differs from the operator's: its defaults for the chat API's CPU (and memory)."""
    cpu, memory = BUILDS[build]
    edits = [(SETTINGS, 'chat_api_cpu: str = "500m"', f'chat_api_cpu: str = "{cpu}"')]
    if memory:
        edits.append((SETTINGS, 'chat_api_memory: str = "512Mi"', f'chat_api_memory: str = "{memory}"'))
    return edits


def build_images(platform: Platform) -> None:
    """Every build's image, built from its code and imported into the real node's containerd."""
    assert platform.node is not None
    builder = images.ImageBuilder(progress=say)
    for build in BUILDS:
        builder.build_edited_into(
            platform.node.socket, images.OPERATOR, build_ref(build).rsplit(":", 1)[1], build_edits(build)
        )


def install(platform: Platform, chart: OperatorChart) -> None:
    """The chart, build A, wave 1, its pod on the real node, watching every namespace; the local
    platform's host paths (the tiny model) and analysis host (Prometheus on 127.0.0.1) allowed."""
    platform.cluster.kubectl("create", "namespace", SYSTEM)
    chart.install([
        *image_values(build_ref("A")), *real_node_values(),
        "--set", "operator.upgradeWave=1",
        "--set", f"operator.allowedHostPaths={{{REPO / '.work'}}}",
        "--set", "operator.analysisAllowedHosts={127.0.0.1}",
    ])  # fmt: skip


def start_build(chart: OperatorChart, build: str, wave: int, wait: bool = False) -> None:
    """`helm upgrade` to `build`'s image with the wave `wave` (0: none)."""
    chart.upgrade([*image_values(build_ref(build)), "--set", f"operator.upgradeWave={wave}"], wait=wait)


def upgrade(platform: Platform, chart: OperatorChart, build: str, wave: int) -> dict[str, Any]:
    """Start `build` and watch the fleets until it has rolled out everywhere (the good builds) or for the
    bad build's watch; what was seen."""
    cpu, memory = BUILDS[build]
    bad = memory is not None
    t0 = time.monotonic()
    start_build(chart, build, wave)
    most, reached, halted_at, held_seen = 0, set(), None, set()
    last: WaveSample | None = None
    timeline: list[tuple[float, int]] = []
    while True:
        now = time.monotonic()
        try:
            last = sample(platform.cluster, cpu)
        except Exception as exc:  # an API hiccup under load: look again
            say(f"sample failed: {exc}")
            time.sleep(1)
            continue
        most = max(most, len(last.rolling))
        reached |= set(last.rolling) | set(last.done)
        held_seen |= set(last.held.values())
        if not timeline or timeline[-1][1] != len(last.rolling):
            timeline.append((round(now - t0, 1), len(last.rolling)))
        if bad:
            if halted_at is None and "UpgradeHalted" in last.held.values():
                halted_at = now
            halt_watched = halted_at is not None and now - halted_at >= HALT_WATCH_SECONDS
            if halt_watched or now - t0 >= BAD_WATCH_SECONDS:
                break
        elif last.finished:
            break
        if now - t0 > UPGRADE_TIMEOUT:
            raise RuntimeError(
                f"upgrade to {build} not finished after {UPGRADE_TIMEOUT:.0f} s: {last}\n{chart.log()}"
            )
        time.sleep(0.5)
    t1 = time.monotonic()
    out = {
        "build": build,
        "wave": wave,
        "seconds": round(t1 - t0, 1),
        "most_rolling": most,
        "fleets_reached": len(reached),
        "held_reasons": sorted(held_seen),
        "halted_after_s": round(halted_at - t0, 1) if halted_at is not None else None,
        "rolling_timeline": timeline,
        "t0": t0,
        "t1": t1,
    }
    shown = {k: v for k, v in out.items() if k not in ("t0", "t1")}
    say(f"upgrade to {build} (wave {wave}): {shown}")
    return out


def quantiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of the values, 0 when there are none."""
    if not values:
        return 0.0, 0.0
    s = sorted(values)
    return s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))]


def row(platform: Platform, chart: OperatorChart, bots: list[Bot], wave: int, label: str) -> dict[str, Any]:
    """One row: the four upgrades under the users, and what they saw."""
    loads = [
        DialogueLoad(
            service_url(platform.cluster, b.ns, b.name),
            concurrency=n,
            pin=False,
            sources=CLIENT_ADDRESSES,
            max_seconds=7200,
            think_seconds=THINK_SECONDS,
        ).start()
        for b, n in zip(bots, split(USERS, len(bots)), strict=True)
    ]
    try:
        for b, load in zip(bots, loads, strict=True):
            b.wait(lambda load=load: load.summary()["ok"] >= 5, 300, "dialogues under way")
        t_quiet = time.monotonic()
        say(f"{label}: users chatting; {QUIET_SECONDS:.0f} s quiet first")
        time.sleep(QUIET_SECONDS)
        upgrades = [upgrade(platform, chart, b, wave) for b in ("B", "A", "C", "A")]
        time.sleep(5)
    finally:
        summaries = [load.stop() for load in loads]
    results = [r for load in loads for r in load.results]
    spans = [(u["t0"], u["t1"]) for u in upgrades]
    during = [r.seconds for r in results if r.outcome == "ok" and any(a <= r.at < b for a, b in spans)]
    quiet = [r.seconds for r in results if r.outcome == "ok" and t_quiet <= r.at < spans[0][0]]
    bad = sorted((r for load in loads for r in load.bad_turns()), key=lambda r: r.at)
    total = {
        k: sum(s[k] for s in summaries) for k in ("turns", "ok", "dialogues", "cut", "non_2xx", "failed")
    }
    total["lost_history"] = sum(s["lost_history"] for s in summaries)
    q50, q99 = quantiles(quiet)
    d50, d99 = quantiles(during)
    good = [u for u in upgrades if u["build"] != "C"]
    bad_build = next(u for u in upgrades if u["build"] == "C")
    return {
        "row": label,
        "wave": wave,
        **total,
        "most_rolling": max(u["most_rolling"] for u in good),
        "good_upgrade_seconds": [u["seconds"] for u in good],
        "bad_build_reached": bad_build["fleets_reached"],
        "bad_build_halted_after_s": bad_build["halted_after_s"],
        "bad_build_most_rolling": bad_build["most_rolling"],
        "quiet_p50_p99_s": [round(q50, 2), round(q99, 2)],
        "during_p50_p99_s": [round(d50, 2), round(d99, 2)],
        "codes": {k: v for s in summaries for k, v in s["codes"].items()},
        "fallbacks": {k: v for s in summaries for k, v in s["fallbacks"].items()},
        "upgrades": [{k: v for k, v in u.items() if k not in ("t0", "t1")} for u in upgrades],
        "bad_turns": [
            {"at_s": round(r.at - t_quiet, 1), "outcome": "lost history" if r.lost else r.outcome,
             "error": r.error}
            for r in bad
        ][:50],
    }  # fmt: skip


def main() -> int:
    """Both rows on one platform and the same fleets; print the table and write the JSON."""
    platform = Platform()
    results: dict[str, Any] = {
        "fleets": FLEETS,
        "users": USERS,
        "builds": {k: {"image": "", "edits": build_edits(k)} for k in BUILDS},
        "operator": "a pod of the chart's Deployment on the real node; upgrades by helm upgrade",
        "resources": RESOURCES,
        "rows": [],
    }
    try:
        platform.up(operator=False)
        build_images(platform)
        for k in BUILDS:
            results["builds"][k]["image"] = build_ref(k)
        chart = OperatorChart(platform.cluster, SYSTEM)
        install(platform, chart)
        say(f"the chart installed, build A; {FLEETS} fleets of one pod on the real node")
        bots = [platform.bot(resources=RESOURCES, wait=False) for _ in range(FLEETS)]
        for b in bots:
            b.wait(b.ready, 900, f"{b.ns}/{b.name} Ready")
        for wave, label in ((1, "Chatfleet, upgrade wave 1"), (0, "no wave (baseline): every fleet at once")):
            say(f"row: {label}")
            start_build(chart, "A", wave, wait=True)  # the row's wave, on the build every fleet runs
            results["rows"].append(row(platform, chart, bots, wave, label))
    finally:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(results, indent=1, default=str))
        platform.down()
    print()
    print(f"{FLEETS} fleets, {USERS} streamed users; upgrades A -> B -> A, then a bad build C, then A again")
    print(
        table(
            results["rows"],
            [
                ("row", "row"),
                ("most_rolling", "most fleets rolling at once"),
                ("bad_build_reached", "fleets the bad build reached"),
                ("good_upgrade_seconds", "seconds per good upgrade"),
                ("turns", "turns"),
                ("cut", "streams cut"),
                ("non_2xx", "non-2xx"),
                ("failed", "no answer"),
                ("lost_history", "lost histories"),
                ("quiet_p50_p99_s", "turn s p50/p99, quiet"),
                ("during_p50_p99_s", "during upgrades"),
            ],
        )
    )
    for r in results["rows"]:
        for b in r["bad_turns"]:
            print(f"  {r['row']}: {b}")
    print(f"\nwritten: {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
