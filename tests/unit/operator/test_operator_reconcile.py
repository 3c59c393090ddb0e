"""One reconcile pass against a fake API client: create, no-op, drift, unsatisfiable, backoff.

Test design: the fake client records writes and plays the API server (apply returns the object with a
resourceVersion); a second pass observes what the first one wrote, as the watch caches would.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from chatfleet_operator.api import ApiError, Reason
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.controller import Controller, backoff_delay
from chatfleet_operator.converge.facts import NodeFacts, PodFacts
from chatfleet_operator.reconcile import Outcome, reconcile_pass
from chatfleet_operator.settings import PodSettings, RetrySettings, Settings
from chatfleet_operator.timefmt import rfc3339
from chatfleet_operator.writes import Gone
from operator_helpers import as_observed, cbs_body

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
NODES = [NodeFacts("gpu-node-0", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, 8)]


class FakeClient:
    """Records writes; applies echo the manifest back with a growing resourceVersion."""

    def __init__(self, refuse: int | None = None) -> None:
        self.refuse = refuse
        self.writes: list[tuple[str, Any]] = []
        self.rv = 100

    def apply(self, manifest):
        if self.refuse:
            message = getattr(self, "refuse_message", "spec.template: bad")
            raise ApiError(self.refuse, "Invalid", json.dumps({"message": message}))
        self.rv += 1
        self.writes.append(("apply", (manifest["kind"], manifest["metadata"]["name"])))
        return as_observed(manifest, self.rv)

    def delete(self, kind, namespace, name):
        self.writes.append(("delete", (kind, name)))

    def patch_status(self, namespace, name, patch):
        self.writes.append(("status", patch))
        return {}

    def seed_replicas(self, namespace, name, replicas):
        self.writes.append(("seed", replicas))

    def post_event(self, involved, type_, reason, message, now=None):
        self.writes.append(("event", (type_, reason)))


def run(body, client, snap=None):
    """One pass."""
    return reconcile_pass(client, body, snap or Snapshot(nodes=NODES), World(), Settings(), NOW)


class TestReconcilePass:
    def test_create_writes_children_and_one_status(self):
        client = FakeClient()
        outcome = run(cbs_body(), client)
        kinds = [w[1][0] for w in client.writes if w[0] == "apply"]
        assert kinds == ["Deployment", "Service"]  # one pod: no PDB; the Triton config is in the template
        assert [w[0] for w in client.writes].count("status") == 1
        assert outcome.problems == [] and outcome.status["phase"] == "Progressing"

    @pytest.mark.parametrize(
        "scaling, pdb",
        [
            ({"replicas": 1}, False),
            ({"replicas": 2}, True),
            ({"autoscale": {"minReplicas": 1, "maxReplicas": 3}}, True),
        ],
    )
    def test_a_pdb_only_where_more_than_one_pod_can_run(self, scaling, pdb):
        client = FakeClient()
        run(cbs_body({"model": {"uri": "hf://org/model"}, "scaling": scaling}), client)
        kinds = [w[1][0] for w in client.writes if w[0] == "apply"]
        assert ("PodDisruptionBudget" in kinds) == pdb

    def test_second_pass_writes_nothing(self):
        client = FakeClient()
        snap = Snapshot(nodes=NODES)
        body = cbs_body()
        outcome = reconcile_pass(client, body, snap, World(), Settings(), NOW)
        body["status"] = outcome.status
        client.writes.clear()
        reconcile_pass(client, body, snap, World(), Settings(), NOW)
        assert client.writes == []

    def test_a_hand_edited_release_history_is_no_reconcile_error(self):
        """status is user-editable: an unknown releaseHistory result is kept as written, never raised on."""
        client = FakeClient()
        body = cbs_body()
        entry = {"revision": "r0", "result": "Reverted", "at": "2026-11-20T10:00:00Z", "message": "by hand"}
        body["status"] = {"releaseHistory": [entry]}
        outcome = run(body, client)
        assert outcome.problems == [] and outcome.status["releaseHistory"] == [entry]

    def test_drift_is_put_back(self):
        client = FakeClient()
        snap = Snapshot(nodes=NODES)
        body = cbs_body()
        body["status"] = reconcile_pass(client, body, snap, World(), Settings(), NOW).status
        template = snap.children[("Deployment", "bot")]["spec"]["template"]
        template["metadata"]["annotations"]["triton.chatfleet.io/chat.config.pbtxt"] = "edited by hand"
        del snap.children[("Service", "bot")]
        client.writes.clear()
        reconcile_pass(client, body, snap, World(), Settings(), NOW)
        assert sorted(w[1] for w in client.writes if w[0] == "apply") == [
            ("Deployment", "bot"),
            ("Service", "bot"),
        ]

    def test_autoscale_adds_hpa_and_turning_it_off_deletes_it(self):
        client = FakeClient()
        snap = Snapshot(nodes=NODES)
        body = cbs_body(
            {"model": {"uri": "hf://a/b"}, "scaling": {"autoscale": {"minReplicas": 1, "maxReplicas": 2}}}
        )
        body["status"] = reconcile_pass(client, body, snap, World(), Settings(), NOW).status
        assert ("HorizontalPodAutoscaler", "bot") in snap.children
        assert ("seed", 1) in client.writes  # spec.scaling.replicas, the scale the HPA reads and writes
        client.writes.clear()
        body = {**body, "spec": {"model": {"uri": "hf://a/b"}, "scaling": {"replicas": 2}}}
        reconcile_pass(client, body, snap, World(), Settings(), NOW)
        assert ("delete", ("HorizontalPodAutoscaler", "bot")) in client.writes

    @pytest.mark.parametrize(
        ("spec", "reason"),
        [
            pytest.param(
                {"model": {"uri": "hf://a/b"}, "resources": {"gpuProduct": "NVIDIA-B200"}},
                Reason.NO_MATCHING_GPU_NODES,
                id="no-such-product",
            ),
            pytest.param(
                {"model": {"uri": "hf://a/b"}, "resources": {"gpusPerReplica": 16}},
                Reason.INSUFFICIENT_GPUS,
                id="too-many-gpus",
            ),
        ],
    )
    def test_unsatisfiable_sets_stalled_and_one_warning(self, spec, reason):
        client = FakeClient()
        outcome = run(cbs_body(spec), client)
        assert [p.reason for p in outcome.problems] == [reason]
        stalled = next(c for c in outcome.status["conditions"] if c["type"] == "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", reason)
        assert [w[1] for w in client.writes if w[0] == "event"] == [("Warning", reason)]

    def test_a_missing_secret_comes_from_the_pods_status_and_names_the_field(self):
        """The client has no Secret call at all: the kubelet's CreateContainerConfigError tells."""
        assert not hasattr(FakeClient(), "secret_exists")
        spec = {"model": {"uri": "hf://a/b"}, "runtime": {"sessions": {"redis": {"secretName": "nope"}}}}
        client = FakeClient()
        assert run(cbs_body(spec), client).problems == []  # no pod yet: nothing known, the pods are built
        assert ("apply", ("Deployment", "bot")) in client.writes
        pod = PodFacts(
            "bot-1",
            "r",
            "stable",
            "Pending",
            False,
            waiting_reason="CreateContainerConfigError",
            waiting_message='secret "nope" not found',
        )
        client = FakeClient()
        outcome = run(cbs_body(spec), client, Snapshot(nodes=NODES, pods=[pod]))
        assert [p.reason for p in outcome.problems] == [Reason.SECRET_NOT_FOUND]
        stalled = next(c for c in outcome.status["conditions"] if c["type"] == "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", Reason.SECRET_NOT_FOUND)
        assert "Secret 'nope' named by spec.runtime.sessions.redis.secretName" in stalled["message"]
        assert [w[1] for w in client.writes if w[0] == "event"] == [("Warning", Reason.SECRET_NOT_FOUND)]

    def test_invalid_object_is_a_problem_not_a_crash(self):
        outcome = run(cbs_body(), FakeClient(refuse=422))
        assert {p.reason for p in outcome.problems} == {Reason.APPLY_FAILED} and not outcome.retry

    def test_terminating_namespace_is_gone_not_an_error(self):
        client = FakeClient(refuse=403)
        client.refuse_message = "unable to create new content in namespace ns because it is being terminated"
        with pytest.raises(Gone):
            run(cbs_body(), client)

    def test_server_errors_are_a_problem_and_retried(self):
        client = FakeClient(refuse=500)
        client.refuse_message = "failed to allocate a serviceIP: range is full"
        outcome = run(cbs_body(), client)
        assert outcome.retry and {p.reason for p in outcome.problems} == {Reason.APPLY_FAILED}
        assert "range is full" in outcome.problems[0].message


class StatusEchoClient(FakeClient):
    """patch_status answers with the object, as the API server does."""

    def patch_status(self, namespace, name, patch):
        self.writes.append(("status", patch))
        return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"}}


def run_passes(client, body, steps, settings: Settings | None = None) -> tuple[list, World]:
    """Run passes at NOW + seconds, each after setting the Deployment's status (None: as it was): the
    status writes and the rerun each pass asked for, and the World they shared."""
    snap, world = Snapshot(nodes=NODES), World()
    seen = []
    for seconds, dep_status in steps:
        if dep_status is not None:
            snap.children[("Deployment", "bot")]["status"] = dep_status
        client.writes.clear()
        now = NOW + timedelta(seconds=seconds)
        outcome = reconcile_pass(client, body, snap, world, settings or Settings(), now)
        body["status"] = outcome.status
        seen.append(([w[1] for w in client.writes if w[0] == "status"], outcome.requeue_after))
    return seen, world


class TestProgressWrites:
    """Progress on the way to Ready (counts, RollingOut -> WaitingForPods) is written at most every
    progress_status_seconds (5); Ready flipping is written at once."""

    def passes(self, *steps, settings: Settings | None = None):
        """Run passes at NOW + seconds; the status writes and the rerun each pass asked for."""
        return run_passes(StatusEchoClient(), cbs_body(), steps, settings)[0]

    WAITING = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "unavailableReplicas": 1}
    READY = {**WAITING, "readyReplicas": 1, "availableReplicas": 1, "unavailableReplicas": 0}

    def test_progress_soon_after_a_write_waits_and_ready_does_not(self):
        (created, _), (progress, wait), (ready, _) = self.passes(
            (0, None), (1, self.WAITING), (2, self.READY)
        )
        assert len(created) == 1 and created[0]["phase"] == "Progressing"
        assert progress == [] and wait == pytest.approx(4.0)
        assert len(ready) == 1 and ready[0]["phase"] == "Ready"

    def test_progress_is_written_once_the_wait_is_over(self):
        _, (held, _), (later, wait) = self.passes((0, None), (1, self.WAITING), (5.5, None))
        assert held == [] and wait is None
        reasons = {c["type"]: c["reason"] for c in later[0]["conditions"]}
        assert reasons["Ready"] == "WaitingForPods" and later[0]["updatedReplicas"] == 1

    def test_a_pass_with_nothing_to_write_asks_for_no_rerun(self):
        _, (same, wait) = self.passes((0, None), (1, None))
        assert same == [] and wait is None

    def test_no_wait_with_the_interval_at_zero(self):
        settings = Settings(retry=RetrySettings(progress_status_seconds=0))
        _, (progress, _), _ = self.passes((0, None), (1, self.WAITING), (2, self.READY), settings=settings)
        assert len(progress) == 1


class CreatingClient(StatusEchoClient):
    """Applies answer with a creationTimestamp, as the API server does: NOW, when the first pass created
    the objects (the tests' passes run at NOW + seconds)."""

    def apply(self, manifest):
        obj = super().apply(manifest)
        obj["metadata"]["creationTimestamp"] = rfc3339(NOW)
        return obj


class TestFirstStatus:
    """A new ChatbotService's first status waits, from its Deployment's creation, for Ready or a problem
    (first_status_seconds, 120): a fleet whose pods are Ready within it gets one status write, not two."""

    def passes(self, *steps):
        """Run passes at NOW + seconds on a ChatbotService showing the CRD's status default; the status
        writes and the rerun each pass asked for, and the World."""
        body = {**cbs_body(), "status": {"observedGeneration": 0, "phase": "Pending"}}  # the CRD's default
        return run_passes(CreatingClient(), body, steps)

    def test_a_fleet_ready_within_the_hold_gets_one_status_write(self):
        (created, wait), (progress, _), (ready, _) = self.passes(
            (0, None), (1, TestProgressWrites.WAITING), (20, TestProgressWrites.READY)
        )[0]
        assert created == [] and wait == pytest.approx(120.0)
        assert progress == []
        assert len(ready) == 1 and ready[0]["phase"] == "Ready" and ready[0]["observedGeneration"] == 1

    def test_the_hold_is_recorded_for_the_triggers_and_a_write_ends_it(self):
        _, world = self.passes((0, None), (1, TestProgressWrites.WAITING))
        assert world.status_held_until(("ns", "bot")) == NOW + timedelta(seconds=120)  # the creation + 120
        _, world = self.passes((0, None), (20, TestProgressWrites.READY))
        assert world.status_held_until(("ns", "bot")) is None

    def test_a_first_rollout_past_the_hold_says_it_is_progressing(self):
        _, (later, _) = self.passes((0, None), (121, TestProgressWrites.WAITING))[0]
        assert len(later) == 1 and later[0]["phase"] == "Progressing" and later[0]["observedGeneration"] == 1
        assert {c["type"]: c["reason"] for c in later[0]["conditions"]}["Ready"] == "WaitingForPods"

    def test_a_problem_is_written_at_once(self):
        spec = {"model": {"uri": "hf://a/b"}, "runtime": {"sessions": {"redis": {"secretName": "nope"}}}}
        pod = PodFacts("bot-1", "r", "stable", "Pending", False, waiting_reason="CreateContainerConfigError")
        client, snap = CreatingClient(), Snapshot(nodes=NODES, pods=[pod])
        reconcile_pass(client, cbs_body(spec), snap, World(), Settings(), NOW)
        assert [w[1]["phase"] for w in client.writes if w[0] == "status"] == ["Failed"]


def deployment(updated: int = 0, ready: int = 0, replicas: int = 2, **meta: Any) -> dict[str, Any]:
    """A watched Deployment of the ChatbotService "bot" asking for `replicas` pods."""
    labels = {"chatfleet.io/service": "bot", **meta.pop("labels", {})}
    return {
        "metadata": {"namespace": "ns", "name": "bot", "generation": 1, "labels": labels, **meta},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 1,
            "replicas": max(updated, ready),
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
        },
    }


class TestProgressTriggers:
    """A Deployment's progress short of Ready triggers its owner's pass only when the progress status may
    be written again; anything else triggers at once."""

    KEY = ("ns", "bot")

    def events(
        self,
        *bodies,
        written_ago: float | None = 1.0,
        interval: float = 5.0,
        wait: float = 0.0,
        held_for: float | None = None,
    ):
        """Feed Deployment events to a Controller whose last status write was `written_ago` seconds ago (and
        whose last pass held the status for `held_for` more seconds); the triggers asked after each, the
        deferred timers, and the triggers after `wait` more seconds."""
        settings = Settings(retry=RetrySettings(progress_status_seconds=interval))
        controller = Controller(settings, FakeClient(), clock=lambda: NOW)
        asked: list[Any] = []
        controller.trigger = lambda key, lane="": asked.append(key)
        if written_ago is not None:
            controller.world.status_written(self.KEY, NOW - timedelta(seconds=written_ago))
        if held_for is not None:
            controller.world.hold_status(self.KEY, NOW + timedelta(seconds=held_for))
        controller.world.changed("Deployment", deployment())  # the echo of the operator's own apply

        async def scenario():
            seen = []
            for body in bodies:
                controller.child_event("Deployment", "MODIFIED", body, self.KEY)
                seen.append(len(asked))
            timers = len(controller._due)
            await asyncio.sleep(wait)
            return seen, timers, len(asked)

        return asyncio.run(scenario())

    def test_progress_waits_for_the_hold_and_is_asked_once(self):
        seen, timers, after = self.events(deployment(updated=1), deployment(updated=2, ready=1))
        assert seen == [0, 0] and timers == 1 and after == 0

    def test_the_deferred_pass_comes_when_the_hold_ends(self):
        seen, _, after = self.events(deployment(updated=1), written_ago=0.0, interval=0.2, wait=0.4)
        assert seen == [0] and after == 1

    def test_progress_waits_for_a_held_first_status(self):
        """No status written yet, the first held for 100 s more: progress asks for a pass only then."""
        seen, timers, _ = self.events(deployment(updated=1), written_ago=None, held_for=100.0)
        assert seen == [0] and timers == 1

    def test_ready_triggers_at_once_while_the_first_status_is_held(self):
        seen, _, _ = self.events(deployment(updated=2, ready=2), written_ago=None, held_for=100.0)
        assert seen == [1]

    def test_ready_triggers_at_once(self):
        seen, _, _ = self.events(deployment(updated=1), deployment(updated=2, ready=2))
        assert seen == [0, 1]

    def test_progress_long_after_the_last_write_triggers_at_once(self):
        assert self.events(deployment(updated=1), written_ago=6.0)[0] == [1]
        assert self.events(deployment(updated=1), written_ago=None)[0] == [1]

    @pytest.mark.parametrize(
        "body",
        [
            pytest.param(deployment(updated=1, labels={"x": "hand-edit"}), id="a-label"),
            pytest.param(deployment(updated=1, generation=2), id="a-new-generation"),
            pytest.param(deployment(replicas=3), id="replicas-asked"),
        ],
    )
    def test_anything_but_progress_triggers_at_once(self, body):
        assert self.events(body)[0] == [1]

    def test_a_pass_drops_the_deferred_trigger(self):
        controller = Controller(Settings(), FakeClient(), clock=lambda: NOW)
        controller.world.status_written(self.KEY, NOW)
        controller.world.changed("Deployment", deployment())

        async def scenario():
            controller.child_event("Deployment", "MODIFIED", deployment(updated=1), self.KEY)
            due = controller._due[self.KEY]
            await controller.run_pass(self.KEY, cbs_body())
            return due.cancelled(), dict(controller._due)

        assert asyncio.run(scenario()) == (True, {})


class TestTheEchoOfAPassOwnWrite:
    """The watch event of a child the running pass has just created often reaches the event loop before the
    apply's response reaches the pass's thread: that echo triggers no pass, while an object new to the watch
    that the pass did not write (or not at that resourceVersion) still triggers one when the pass ends."""

    KEY = ("ns", "bot")

    def scenario(self, echo: Any) -> tuple[list[str], list[Any]]:
        """A first pass whose every apply is preceded, on the event loop, by the watch event `echo(manifest,
        rv)` makes of it (None: no event); returns the kinds applied and the triggers asked afterwards."""
        import threading

        from chatfleet_operator.kinds import BY_NAME

        client = FakeClient()
        controller = Controller(Settings(), client, clock=lambda: NOW)
        controller.world.indexes = {BY_NAME["Node"].index: {"nodes": NODES}}
        asked: list[Any] = []
        controller.trigger = lambda key, lane="": asked.append(key)
        applied: list[str] = []

        async def main() -> None:
            loop = asyncio.get_running_loop()
            apply = client.apply

            def apply_after_its_watch_event(manifest):
                event = echo(manifest, client.rv + 1)
                if event is not None:
                    delivered = threading.Event()

                    def deliver() -> None:
                        controller.child_event(manifest["kind"], "ADDED", event, self.KEY)
                        delivered.set()

                    loop.call_soon_threadsafe(deliver)
                    delivered.wait(5)
                applied.append(manifest["kind"])
                return apply(manifest)

            client.apply = apply_after_its_watch_event
            await controller.run_pass(self.KEY, cbs_body())

        asyncio.run(main())
        return applied, asked

    def test_the_echo_of_each_write_triggers_nothing(self):
        applied, asked = self.scenario(lambda manifest, rv: as_observed(manifest, rv))
        assert "Deployment" in applied and "Service" in applied
        assert asked == []

    def test_a_child_the_pass_did_not_write_at_that_version_triggers_a_pass_when_it_ends(self):
        applied, asked = self.scenario(lambda manifest, rv: as_observed(manifest, rv + 7))
        assert "Deployment" in applied
        assert asked == [self.KEY]

    def test_without_events_during_the_pass_nothing_is_asked(self):
        assert self.scenario(lambda manifest, rv: None)[1] == []


class TestOneTimerPerObject:
    """Each object has one timer for its next pass on time: the earliest asked wins, any pass drops it."""

    def test_the_earliest_due_pass_wins(self):
        controller = Controller(Settings(), FakeClient())
        key, asked = ("ns", "bot"), []
        controller.trigger = lambda k, lane="": asked.append(k)

        async def scenario():
            controller._pass_due_in(key, 0.3)
            controller._pass_due_in(key, 5.0)  # later: kept at 0.3
            controller._pass_due_in(key, 0.1)  # sooner: replaces it
            await asyncio.sleep(0.5)
            return list(asked), dict(controller._due)

        assert asyncio.run(scenario()) == ([key], {})

    def test_a_pass_drops_the_timer_and_its_outcome_asks_again(self):
        """A held progress status asks for a pass when the hold ends; a pass before then (the Deployment
        got Ready) drops that timer, and its outcome sets the next one only if it still waits on time."""
        controller = Controller(Settings(), FakeClient())
        key = ("ns", "bot")
        waits = iter([4.0, None, 30.0])

        def timed_pass(body, snap, timing):
            return Outcome(problems=[], writes=0, status={}, requeue_after=next(waits))

        controller._timed_pass = timed_pass

        async def scenario():
            seen = []
            for _ in range(3):
                before = controller._due.get(key)
                await controller.run_pass(key, cbs_body())
                after = controller._due.get(key)
                seen.append((before is not None and before.cancelled(), after is not None))
            return seen

        # held (a timer), Ready (the timer dropped, none asked), a release pause (a timer again)
        assert asyncio.run(scenario()) == [(False, True), (True, False), (False, True)]


class TestBackoff:
    @pytest.mark.parametrize(
        ("retry", "delay"),
        [
            pytest.param(0, 5, id="first"),
            pytest.param(1, 10, id="second"),
            pytest.param(3, 40, id="fourth"),
            pytest.param(10, 300, id="capped"),
        ],
    )
    def test_delay_grows_and_caps(self, retry, delay):
        assert backoff_delay(retry, 5, 300) == delay


class FailingClient(FakeClient):
    """A client whose apply raises something other than an API error, as a bug in a pass would."""

    def apply(self, manifest):
        raise ValueError("injected failure\nwith a second line")


def allowing(*prefixes: str) -> Settings:
    """Settings whose operator allows these host path prefixes (--allowed-host-path)."""
    return Settings(pod=PodSettings(allowed_host_paths=prefixes))


class TestHostPathPolicy:
    """spec.model.hostPath outside the operator's allowed prefixes: nothing built, one status, one event."""

    @pytest.mark.parametrize(
        ("path", "allowed"),
        [
            pytest.param("/models/tiny", (), id="none-allowed-by-default"),
            pytest.param("/etc", ("/models",), id="outside"),
            pytest.param("/modelsx", ("/models",), id="prefix-not-on-a-segment"),
            pytest.param("/models/../etc", ("/models",), id="dot-dot"),
        ],
    )
    def test_refused_builds_nothing_and_names_the_field(self, path, allowed):
        client = FakeClient()
        body = cbs_body({"model": {"hostPath": path}})
        outcome = reconcile_pass(client, body, Snapshot(nodes=NODES), World(), allowing(*allowed), NOW)
        assert outcome.refused and [p.reason for p in outcome.problems] == [Reason.HOST_PATH_NOT_ALLOWED]
        assert [w[0] for w in client.writes] == ["status", "event"]  # no apply: no Deployment, no Service
        ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", Reason.HOST_PATH_NOT_ALLOWED)
        assert f"spec.model.hostPath {path!r}" in ready["message"]
        assert outcome.status["observedGeneration"] == 1 and outcome.status["phase"] == "Failed"
        assert client.writes[1][1] == ("Warning", Reason.HOST_PATH_NOT_ALLOWED)

    def test_allowed_prefix_builds_the_deployment(self):
        client = FakeClient()
        body = cbs_body({"model": {"hostPath": "/models/tiny"}})
        outcome = reconcile_pass(client, body, Snapshot(nodes=NODES), World(), allowing("/models"), NOW)
        assert outcome.problems == [] and not outcome.refused
        assert ("apply", ("Deployment", "bot")) in client.writes

    def test_refusal_is_not_retried_and_a_second_pass_writes_nothing(self):
        """No hot loop: no retry timer, and a pass over the refused status (a pod event) writes nothing."""
        client = FakeClient()
        controller = Controller(Settings(), client)
        body = cbs_body({"model": {"hostPath": "/etc"}})
        assert asyncio.run(controller.attempt(("ns", "bot"), body)) is None
        patch = next(w[1] for w in client.writes if w[0] == "status")
        body["status"] = merge_patch({}, patch)
        client.writes.clear()
        assert asyncio.run(controller.attempt(("ns", "bot"), body)) is None
        assert client.writes == []

    def test_a_running_release_keeps_its_facts(self):
        """Refusing generation 2 keeps what generation 1 left (counts, revisions), only the conditions change."""
        client = FakeClient()
        body = cbs_body({"model": {"hostPath": "/models/a"}}, generation=2)
        body["status"] = {"observedGeneration": 1, "stableRevision": "abc", "replicas": 1, "conditions": []}
        outcome = reconcile_pass(client, body, Snapshot(nodes=NODES), World(), allowing("/data"), NOW)
        assert outcome.status["stableRevision"] == "abc" and outcome.status["replicas"] == 1
        assert outcome.status["observedGeneration"] == 2


class TestPassThatRaises:
    """A pass that raises is visible: status condition + one Warning event, kopf backoff, no log only."""

    SPEC = {"model": {"uri": "hf://a/b"}, "runtime": {"sessions": {"redis": {"secretName": "r"}}}}

    def attempt(self, controller, body):
        """One pass; the retry it calls for (it must call for one)."""
        meta = body["metadata"]
        retry = asyncio.run(controller.attempt((meta["namespace"], meta["name"]), body))
        assert retry is not None
        return retry

    def test_status_event_and_backoff(self):
        client = FailingClient()
        controller = Controller(Settings(), client)
        body = cbs_body(self.SPEC, generation=3)
        body["status"] = {"observedGeneration": 2}
        retry = self.attempt(controller, body)
        assert retry.delay == 5 and "injected failure" in retry.why
        patches = [w[1] for w in client.writes if w[0] == "status"]
        assert len(patches) == 1
        ready = next(c for c in patches[0]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", Reason.RECONCILE_ERROR)
        assert ready["message"].endswith(": ValueError: injected failure")  # the first line only
        assert "observedGeneration" not in patches[0]  # generation 3 was not reconciled
        assert [w[1] for w in client.writes if w[0] == "event"] == [("Warning", Reason.RECONCILE_ERROR)]

    def test_retries_back_off_and_do_not_repeat_the_event(self):
        client = FailingClient()
        controller = Controller(Settings(), client)
        body = cbs_body(self.SPEC)
        delays, events = [], []
        for _ in range(3):
            client.writes.clear()
            delays.append(self.attempt(controller, body).delay)
            events += [w[1] for w in client.writes if w[0] == "event"]
            for patch in (w[1] for w in client.writes if w[0] == "status"):  # what the watch would show next
                body["status"] = merge_patch(body.get("status") or {}, patch)
        assert delays == [5, 10, 20]
        assert events == [("Warning", Reason.RECONCILE_ERROR)]


def merge_patch(target, patch):
    """Apply a JSON merge patch (RFC 7386) to a dict."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out


def test_the_httproute_is_watched_so_a_pass_applies_it_only_when_it_differs():
    """The HTTPRoute is an owned object like the others: in the watch cache (kopf index) and, right after
    the operator's own write, in the remembered writes. Before, it was neither, so every pass of a release
    found it missing and applied it again ("Created HTTPRoute ... (missing)" about once a second)."""
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "bot", "namespace": "ns", "resourceVersion": "7"},
        "spec": {"rules": []},
    }
    written = World()
    written.remember("HTTPRoute", "ns", "bot", route, 7)
    assert written.snapshot(("ns", "bot")).children.get(("HTTPRoute", "bot")) == route
    watched = World()
    watched.indexes = {"httproute_index": {("ns", "bot"): [route]}}
    assert watched.snapshot(("ns", "bot")).children.get(("HTTPRoute", "bot")) == route
