"""The upgrade wave: a new pod template of the same revision (an operator upgrade) reaches at most N
ChatbotServices at a time; a failing one halts the wave; releases and new fleets never wait.

Test design: fleets are first reconciled by an "old operator" (other pod settings: the chat API's CPU),
their Deployments then marked rolled out as the Deployment controller would; the "new operator" (the
default settings, so the same revision and a new template) then passes over them with one shared
`UpgradeWave`, against the fake API client of the reconcile tests. What each pass writes, and the
status it computes, say who was admitted and who holds. Before the wave, every fleet's Deployment was
re-applied in its first pass after the upgrade (all fleets rolled at once).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from chatfleet_operator import api
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.defaults import ClusterDefaults
from chatfleet_operator.reconcile import Outcome, reconcile_pass
from chatfleet_operator.release.strategy import ReleasePlan
from chatfleet_operator.settings import PodSettings, RuntimeSettings, Settings
from chatfleet_operator.wave import Answer, UpgradeWave, rollout_state, template_upgrade
from operator_helpers import ScriptedController, cbs_body
from test_operator_reconcile import NODES, NOW, FakeClient

OLD = Settings(pod=PodSettings(chat_api_cpu="250m"))
NEW = Settings()
#: A new operator whose default runtime image changed: a new revision for every fleet that names none.
NEW_IMAGE = Settings(
    runtime=RuntimeSettings(defaults=ClusterDefaults(runtime_image="r/chatfleet-runtime:0.2.0"))
)


class Fleet:
    """One ChatbotService, its watch-cache snapshot, and its passes."""

    def __init__(self, name: str, spec: dict[str, Any] | None = None) -> None:
        self.name = name
        self.body = cbs_body(spec, name=name)
        self.snap = Snapshot(nodes=NODES)
        self.client = FakeClient()

    def run(self, settings: Settings, wave: UpgradeWave | None = None) -> Outcome:
        self.client.writes.clear()
        outcome = reconcile_pass(self.client, self.body, self.snap, World(), settings, NOW, wave=wave)
        self.body["status"] = outcome.status
        return outcome

    @property
    def deployment(self) -> dict[str, Any]:
        return self.snap.children[("Deployment", self.name)]

    def rolled_out(self, replicas: int = 1, updated: int | None = None) -> None:
        """The Deployment controller's status: every replica on the template and available (or
        `updated` of them, old pods still up)."""
        dep = self.deployment
        done = replicas if updated is None else updated
        dep["metadata"]["generation"] = 1
        dep["status"] = {
            "observedGeneration": 1,
            "replicas": replicas,
            "updatedReplicas": done,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
        }

    def applied(self) -> list[tuple[str, str]]:
        return [w[1] for w in self.client.writes if w[0] == "apply"]

    def events(self) -> list[tuple[str, str]]:
        """(type, reason) of the events the last pass posted."""
        return [w[1] for w in self.client.writes if w[0] == "event"]

    def held(self) -> dict[str, Any] | None:
        return next(
            (c for c in self.body["status"]["conditions"] if c["type"] == api.COND_UPGRADE_HELD), None
        )


def converged(name: str, spec: dict[str, Any] | None = None, settings: Settings = OLD) -> Fleet:
    """A fleet the old operator reconciled, its pods rolled out."""
    fleet = Fleet(name, spec)
    fleet.run(settings)
    fleet.rolled_out()
    fleet.run(settings)
    assert fleet.held() is None
    return fleet


def chat_api_cpu(fleet: Fleet) -> str:
    containers = fleet.deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "chat-api")["resources"]["limits"]["cpu"]


def test_an_upgrade_reaches_at_most_n_fleets_and_the_next_goes_when_one_is_done():
    wave = UpgradeWave(2)
    fleets = [converged(n) for n in ("a", "b", "c")]
    before = [copy.deepcopy(f.deployment["spec"]["template"]) for f in fleets]
    outcomes = [f.run(NEW, wave) for f in fleets]

    # the held fleet's pod template is the one it had: its pods do not restart (its Deployment may be
    # written once, for the new operator's Deployment-level fields and hash annotation)
    assert [f.deployment["spec"]["template"] == b for f, b in zip(fleets, before, strict=True)] == [
        False,
        False,
        True,
    ]
    assert [chat_api_cpu(f) for f in fleets] == ["500m", "500m", "250m"]
    assert [o.upgrade_held for o in outcomes] == [False, False, True]
    held = fleets[2].held()
    assert held is not None and (held["status"], held["reason"]) == ("True", api.Reason.UPGRADE_QUEUED)
    assert "2 of 2 fleets" in held["message"] and "--upgrade-wave" in held["message"]
    assert wave.rolling() == [("ns", "a"), ("ns", "b")]

    # the hold is told once as a Normal event (kubectl describe / get events); the held pass posts it,
    # the next pass of the held fleet changes nothing and says nothing again while the wave is full
    assert fleets[2].events() == [("Normal", api.Reason.UPGRADE_QUEUED)]
    assert fleets[2].run(NEW, wave).upgrade_held and fleets[2].applied() == []
    assert fleets[2].events() == []

    fleets[0].rolled_out()
    assert fleets[0].run(NEW, wave).wave_changed and fleets[0].held() is None
    assert wave.rolling() == [("ns", "b")]
    outcome = fleets[2].run(NEW, wave)
    assert not outcome.upgrade_held and ("Deployment", "c") in fleets[2].applied()
    assert chat_api_cpu(fleets[2]) == "500m" and fleets[2].held() is None


def test_without_a_wave_every_fleet_rolls_at_once():
    """Size 0 is no limit: the behaviour before the wave."""
    wave = UpgradeWave(0)
    fleets = [converged(n) for n in ("a", "b", "c")]
    assert all(not f.run(NEW, wave).upgrade_held for f in fleets)
    assert [chat_api_cpu(f) for f in fleets] == ["500m"] * 3


def test_a_failing_upgrade_halts_the_wave_until_it_recovers():
    wave = UpgradeWave(2)
    a, b = converged("a"), converged("b")
    a.run(NEW, wave)
    revision = a.deployment["metadata"]["labels"][api.LABEL_REVISION]
    looping = PodFacts(
        "a-new", revision, "stable", "Running", False, restarts=3, waiting_reason="CrashLoopBackOff"
    )
    a.snap.pods = [looping]
    # the held fleets must hear of the halt: they have no timer, so the pass that finds it wakes them
    # (before, this pass woke nobody, and held fleets said UpgradeQueued for as long as nothing else moved)
    assert a.run(NEW, wave).wave_changed
    assert not a.run(NEW, wave).wave_changed  # told once

    outcome = b.run(NEW, wave)
    held = b.held()
    assert outcome.upgrade_held and chat_api_cpu(b) == "250m"
    assert held is not None and held["reason"] == api.Reason.UPGRADE_HALTED
    assert "ns/a failed its update" in held["message"] and "crash-looping" in held["message"]
    assert b.events() == [("Warning", api.Reason.UPGRADE_HALTED)]  # a halt is a problem elsewhere

    a.snap.pods = []
    a.rolled_out()
    assert a.run(NEW, wave).wave_changed
    assert not b.run(NEW, wave).upgrade_held and chat_api_cpu(b) == "500m"


def test_a_restarted_operator_counts_the_fleets_it_finds_part_way():
    """The wave is memory: a new process sees a's rollout part-way (old pods still up) and counts it."""
    a, b = converged("a"), converged("b")
    a.run(NEW, UpgradeWave(1))  # the process before the restart admitted a
    a.rolled_out(replicas=2, updated=1)

    wave = UpgradeWave(1)  # the restarted process
    a.run(NEW, wave)
    assert wave.rolling() == [("ns", "a")]
    assert b.run(NEW, wave).upgrade_held and chat_api_cpu(b) == "250m"


def test_releases_and_new_fleets_never_wait_for_the_wave():
    wave = UpgradeWave(1)
    a, b = converged("a"), converged("b")
    a.run(NEW, wave)  # the one place is taken

    b.body["spec"] = {"model": {"uri": "hf://org/other"}}  # a new revision: a release, with its canary
    b.body["metadata"]["generation"] = 2
    outcome = b.run(NEW, wave)
    assert not outcome.upgrade_held and ("Deployment", "b-canary") in b.applied()

    new = Fleet("c")
    assert not new.run(NEW, wave).upgrade_held and ("Deployment", "c") in new.applied()


def image(fleet: Fleet, name: str) -> str | None:
    dep = fleet.snap.children.get(("Deployment", name))
    if dep is None:
        return None
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "triton")["image"]


def test_a_new_default_image_starts_its_releases_a_few_at_a_time_and_a_rollback_halts_them():
    """The operator's new default image is a new revision for the fleets that name none: each starts a
    release with its canary and analysis, but only as the wave has room; a rolled-back one halts it."""
    wave = UpgradeWave(1)
    a, b = converged("a", settings=NEW), converged("b", settings=NEW)
    old_image = image(a, "a")

    out_a, out_b = a.run(NEW_IMAGE, wave), b.run(NEW_IMAGE, wave)
    assert not out_a.upgrade_held and image(a, "a-canary") == "r/chatfleet-runtime:0.2.0"
    assert a.body["status"]["release"]["origin"] == "operator"
    assert out_b.upgrade_held and image(b, "b-canary") is None and image(b, "b") == old_image
    assert "release" not in b.body["status"] and b.held()["reason"] == api.Reason.UPGRADE_QUEUED

    a.body["spec"] = {**a.body["spec"], "rollout": {"abort": "*"}}  # the release fails: rolled back
    a.body["metadata"]["generation"] = 2
    a.run(NEW_IMAGE, wave)
    assert a.body["status"]["release"]["phase"] == "RolledBack"
    b.run(NEW_IMAGE, wave)
    assert b.held()["reason"] == api.Reason.UPGRADE_HALTED and "was rolled back" in b.held()["message"]

    # the operator's default goes back (the platform team rolls the chart back): a leaves the wave
    assert a.run(NEW, wave).wave_changed
    assert not b.run(NEW, wave).upgrade_held and b.held() is None


def test_a_release_the_user_asked_for_never_waits_even_with_a_new_default():
    """A spec change (a new generation) starts its release at once: the user asked for it."""
    wave = UpgradeWave(1)
    a, b = converged("a", settings=NEW), converged("b", settings=NEW)
    a.run(NEW_IMAGE, wave)  # the one place is taken
    b.body["spec"] = {"model": {"uri": "hf://org/other"}}
    b.body["metadata"]["generation"] = 2
    assert not b.run(NEW_IMAGE, wave).upgrade_held and image(b, "b-canary") == "r/chatfleet-runtime:0.2.0"
    assert "origin" not in b.body["status"]["release"]


def test_a_release_the_user_starts_takes_the_fleet_out_of_the_wave():
    """The user's release has its own gates (canary, analysis, rollback): its place goes to the next."""
    wave = UpgradeWave(1)
    a, b = converged("a"), converged("b")
    a.run(NEW, wave)  # a's new template is rolling
    assert b.run(NEW, wave).upgrade_held
    a.body["spec"] = {"model": {"uri": "hf://org/other"}}
    a.body["metadata"]["generation"] = 2
    assert a.run(NEW, wave).wave_changed and "origin" not in a.body["status"]["release"]
    assert not b.run(NEW, wave).upgrade_held and chat_api_cpu(b) == "500m"


def test_a_restarted_operator_counts_its_releases_under_way():
    a, b = converged("a", settings=NEW), converged("b", settings=NEW)
    a.run(NEW_IMAGE, UpgradeWave(1))  # the process before the restart started a's release
    wave = UpgradeWave(1)  # the restarted process
    a.run(NEW_IMAGE, wave)
    assert wave.rolling() == [("ns", "a")]
    assert b.run(NEW_IMAGE, wave).upgrade_held


def test_the_wave_registry():
    wave = UpgradeWave(1)
    assert wave.ask(("ns", "a")) == Answer(True)
    assert wave.ask(("ns", "a")) == Answer(True)  # asking again keeps its one place
    queued = wave.ask(("ns", "b"))
    assert not queued.admitted and queued.reason == api.Reason.UPGRADE_QUEUED
    assert not wave.observe(("ns", "b"), updating=True, failing="")  # not in the wave: nothing to tell
    assert wave.observe(("ns", "a"), updating=True, failing="pod x is crash-looping")  # a halt began
    assert not wave.observe(("ns", "a"), updating=True, failing="pod x is crash-looping")  # said once
    assert wave.ask(("ns", "b")).reason == api.Reason.UPGRADE_HALTED
    assert wave.observe(("ns", "a"), updating=True, failing="")  # recovered while rolling: the halt lifts
    assert wave.ask(("ns", "b")).reason == api.Reason.UPGRADE_QUEUED
    assert wave.observe(("ns", "c"), updating=True, failing="", counted=True) is False
    assert wave.rolling() == [("ns", "a"), ("ns", "c")]  # a rollout found part-way counts past the size
    assert not wave.observe(("ns", "c"), updating=True, failing="pods Pending", counted=True)
    assert wave.ask(("ns", "b")).reason == api.Reason.UPGRADE_QUEUED  # found, not admitted: no halt
    wave.forget(("ns", "a"))
    assert wave.observe(("ns", "c"), updating=False, failing="")
    assert wave.ask(("ns", "b")) == Answer(True)
    assert wave.observe(
        ("ns", "d"), updating=True, failing="rolled back", counted=True, vouched=True
    )  # halts
    assert wave.ask(("ns", "e")).reason == api.Reason.UPGRADE_HALTED  # an operator release answers for itself


def test_template_upgrade_and_rollout_state_are_plain_rules():
    fleet = converged("a")
    observed = fleet.deployment
    revision = observed["metadata"]["labels"][api.LABEL_REVISION]
    same = {"spec": {"template": observed["spec"]["template"]}}
    changed = {
        "spec": {"template": {**observed["spec"]["template"], "metadata": {"annotations": {"x": "1"}}}}
    }
    assert not template_upgrade(observed, same, revision)
    assert template_upgrade(observed, changed, revision)
    assert not template_upgrade(observed, changed, "another-revision")  # a release, not an upgrade
    assert not template_upgrade(None, changed, revision)  # a new fleet
    assert rollout_state(
        None, ReleasePlan(in_release=False, stable_from_spec=True, stable_replicas=1, canary_replicas=0)
    ) == (
        False,
        False,
    )


class TwoFleets(ScriptedController):
    """Passes return a set outcome per ChatbotService and record which ran."""

    def __init__(self, outcomes: dict[str, Outcome]) -> None:
        super().__init__()
        self.outcomes = outcomes
        self.ran: list[str] = []

    def see(self, name: str) -> None:
        body = cbs_body(name=name)
        body["metadata"]["resourceVersion"] = "1"
        self.cache[("ns", name)] = [body]
        self.cbs_event(None, body)


@pytest.fixture
def scripted(monkeypatch):
    def recorded(controller: TwoFleets, body: dict[str, Any], *_: Any) -> Outcome:
        name = body["metadata"]["name"]
        controller.ran.append(name)
        return controller.outcomes[name]

    monkeypatch.setattr("chatfleet_operator.controller.reconcile_pass", recorded)


def test_a_freed_place_runs_the_held_fleets_again_at_once(scripted):
    """A held fleet has no timer to wake it: the pass that frees a place (or a deletion) asks for its pass."""

    async def scenario() -> list[list[str]]:
        ctl = TwoFleets(
            {"held": Outcome([], 0, {}, upgrade_held=True), "rolling": Outcome([], 0, {}, wave_changed=False)}
        )
        ctl.see("held")
        ctl.see("rolling")
        await ctl.settle()
        seen = [sorted(ctl.ran)]
        ctl.outcomes["rolling"] = Outcome([], 0, {}, wave_changed=True)
        ctl.trigger(("ns", "rolling"))
        await ctl.settle()
        seen.append(sorted(ctl.ran))
        ctl.wave.ask(("ns", "rolling"))
        ctl.forget(("ns", "rolling"))  # deleted while holding a place
        await ctl.settle()
        seen.append(sorted(ctl.ran))
        return seen

    assert asyncio.run(scenario()) == [
        ["held", "rolling"],
        ["held", "held", "rolling", "rolling"],
        ["held", "held", "held", "rolling", "rolling"],
    ]


def test_a_hand_edit_of_the_template_is_put_back_at_once_even_with_the_wave_full():
    """Drift is no upgrade: the operator's own desired object did not change (its desired-hash is the one
    on the Deployment), so the repair never waits for a place."""
    wave = UpgradeWave(1)
    a, b = converged("a", settings=NEW), converged("b", settings=NEW)
    assert wave.ask(("ns", "someone-else")).admitted  # the one place is taken
    template = b.deployment["spec"]["template"]
    template["metadata"]["annotations"]["triton.chatfleet.io/chat.config.pbtxt"] = "edited by hand"
    outcome = b.run(NEW, wave)
    assert not outcome.upgrade_held and ("Deployment", "b") in b.applied()
    assert (
        b.deployment["spec"]["template"]["metadata"]["annotations"]["triton.chatfleet.io/chat.config.pbtxt"]
        != "edited by hand"
    )
    assert not a.run(NEW, wave).upgrade_held
