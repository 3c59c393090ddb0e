"""Release scenarios on the pure planner, narrated tick by tick with an injected clock (1 tick = 1 s).

Test design: `World` (release_sim.py) plays the cluster and Prometheus; each test sets a scenario knob
(canary health, error rate, Prometheus up) and asserts what status says after the ticks that matter.
Steps: 20% (pause 10 s), 50% (pause 10 s), 100%; analysis every 10 s, failureLimit 2, deadline 30 s.
"""

from __future__ import annotations

from chatfleet_operator.release.state import ReleasePhase
from chatfleet_operator.release.strategy import ReleaseReason
from chatfleet_operator.release.traffic import HTTPROUTE, REPLACE_IN_PLACE
from release_sim import World, spec_dict, world

PROGRESSING, PROMOTING = ReleasePhase.STEPPING, ReleasePhase.PROMOTING
ROLLED_BACK, SWITCHED = ReleasePhase.ROLLED_BACK, ReleasePhase.SWITCHED


def promoted(w: World) -> bool:
    return w.status.get("stableRevision") == "B"


def test_healthy_canary_promotes_through_every_step():
    w = world()
    # tick 1: spec revision B != stable A -> the release starts at step 1 (20%), the canary is created.
    p = w.tick()
    assert w.phase == PROGRESSING and p.canary_weight == 20 and p.canary_replicas == 1
    assert p.events[0].reason == ReleaseReason.STARTED
    weights = set()
    # ticks 2..: pause 10 s + a passing analysis per step, then 50%, then 100%, then promotion.
    w.run_until(lambda w: weights.add(w.status.get("canaryWeight")) or promoted(w), max_ticks=120)
    assert {20, 50, 100} <= weights
    assert w.status["releaseHistory"][0]["result"] == "Promoted"
    assert "release" not in w.status and w.plans[-1].canary_replicas == 0 and w.plans[-1].stable_from_spec
    assert w.status["canaryWeight"] == 0


def test_error_rate_regression_rolls_back_in_failure_limit_checks():
    w = world()
    w.error_rate = 4.2
    # tick 1: release starts; tick 2: canary Ready -> analysis from tick 22 (one 20 s rate() window later,
    # so the window holds only this canary's requests).
    w.tick()
    w.tick()
    assert w.status["release"]["analysisFrom"] == "2026-11-21T10:00:22Z"
    # tick 22: first measurement: 4.2% > 1% -> failed 1 of 2.
    w.run_until(lambda w: w.status["release"]["analysis"]["failed"] == 1)
    assert w.phase == PROGRESSING and w.now.second == 22
    # tick 32: second failed check -> rollback: traffic to stable, canary to zero, Stalled, Warning.
    n = w.run_until(lambda w: w.phase == ROLLED_BACK)
    assert n == 10
    plan = w.plans[-1]
    assert plan.canary_replicas == 0 and plan.canary_weight == 0 and plan.stable_replicas == 2
    assert not plan.stable_from_spec
    assert plan.gate.kind == "stalled"
    assert "error rate 4.2% > 1%" in plan.gate.message and "in 2 of 2 checks" in plan.gate.message
    assert [e.type for e in plan.events] == ["Warning"]
    # ticks later: the rolled-back revision is not retried while the spec stays on it.
    for _ in range(30):
        assert w.tick().canary_replicas == 0
    assert w.measured == 2
    # a new spec revision C starts a new release.
    w.update = "C"
    w.error_rate = 0.1
    assert w.tick().release.revision == "C"


def test_a_new_retry_token_starts_a_rolled_back_release_again_once():
    w = world()
    w.error_rate = 4.2
    w.run_until(lambda w: w.phase == ROLLED_BACK)
    # the canary is fixed outside the spec (a model server's dependency, a node): retry the same revision
    w.error_rate = 0.1
    w.set_rollout(retry="2026-11-21T10:05:00Z")
    plan = w.tick()
    assert plan.release.revision == "B" and w.phase == PROGRESSING and plan.canary_replicas > 0
    assert w.status["release"]["retry"] == "2026-11-21T10:05:00Z"
    (started,) = [e for e in plan.events if e.reason == ReleaseReason.STARTED]
    assert "again after its rollback (spec.rollout.retry=2026-11-21T10:05:00Z)" in started.message
    assert [h["result"] for h in w.status["releaseHistory"]] == ["RolledBack"]
    # it fails again: rolled back, and the same token never starts it a third time
    w.error_rate = 4.2
    w.run_until(lambda w: w.phase == ROLLED_BACK)
    for _ in range(30):
        assert w.tick().canary_replicas == 0
    # a new token does
    w.error_rate = 0.1
    w.set_rollout(retry="2026-11-21T10:30:00Z")
    w.tick()
    w.run_until(promoted, max_ticks=200)


def test_a_retry_token_set_before_a_release_does_not_restart_its_rollback():
    w = world(rollout={"retry": "t1"})
    w.error_rate = 4.2
    w.run_until(lambda w: w.phase == ROLLED_BACK)
    assert w.status["release"]["retry"] == "t1"
    for _ in range(30):
        assert w.tick().canary_replicas == 0


def test_latency_regression_alone_rolls_back():
    w = world()
    w.latency = 900.0  # error rate fine, P99 900 ms > 500 ms
    w.run_until(lambda w: w.phase == ROLLED_BACK)
    assert "P99 latency 900ms > 500ms" in w.status["abortReason"]
    assert "error rate" not in w.status["abortReason"]


def test_canary_pods_never_ready_roll_back_at_the_deadline():
    w = world()
    w.canary_health = "unready"
    # ticks 1-30: waiting for canary pods; no measurement is taken without a Ready pod.
    n = w.run_until(lambda w: w.phase == ROLLED_BACK)
    assert 30 <= n <= 32 and w.measured == 0
    assert "0/1 pods Ready after progressDeadlineSeconds (30s)" in w.status["abortReason"]


def test_crash_looping_canary_rolls_back_without_waiting_for_metrics():
    w = world()
    w.tick()
    w.canary_health = "crashloop"
    # tick 2: the canary pod goes into CrashLoopBackOff (seen by the next pass);
    # tick 3: rollback on this very pass, with no measurement needed.
    w.tick()
    w.tick()
    assert w.phase == ROLLED_BACK and "crash-looping" in w.status["abortReason"]


def test_no_traffic_pauses_instead_of_promoting():
    w = world()
    w.error_rate = None  # no requests reach the canary
    for _ in range(100):
        w.tick()
    # never promoted, never rolled back: paused on step 1 with the reason in status.
    assert w.phase == PROGRESSING and w.status["currentStepIndex"] == 0
    assert w.gate == ReleaseReason.NO_TRAFFIC
    assert w.status["release"]["analysis"]["inconclusive"] >= 7
    # traffic arrives -> the next passing measurement moves on.
    w.error_rate = 0.1
    w.run_until(promoted, max_ticks=100)


def test_prometheus_down_pauses_with_a_condition_and_resumes():
    w = world()
    w.tick()
    w.prometheus_up = False
    # ticks: errors 1, 2, 3 > consecutiveErrorLimit 2 -> paused with AnalysisError; never a rollback.
    w.run_until(
        lambda w: (
            w.gate == ReleaseReason.ANALYSIS_ERROR
            and w.status["release"]["analysis"]["consecutiveErrors"] > 2
        )
    )
    assert "did not answer" in w.plans[-1].gate.message
    for _ in range(60):
        w.tick()
    assert w.phase == PROGRESSING and w.status["currentStepIndex"] == 0
    # Prometheus returns -> the release resumes and promotes.
    w.prometheus_up = True
    w.run_until(promoted, max_ticks=100)


def test_operator_restart_resumes_from_status():
    w = world()
    w.run_until(lambda w: w.status.get("currentStepIndex") == 1)
    # "kill the operator": a fresh World that only keeps status and the cluster's Deployments.
    w2 = World(spec=w.spec, now=w.now, status=dict(w.status))
    w2.stable, w2.canary = w.stable, w.canary
    p = w2.tick()
    assert p.canary_weight == 50 and w2.status["currentStepIndex"] == 1 and not p.events
    w2.run_until(promoted, max_ticks=100)
    assert [h["result"] for h in w2.status["releaseHistory"]] == ["Promoted"]


def test_manual_abort():
    w = world()
    w.tick()
    w.set_rollout(abort="B")
    w.tick()
    assert w.phase == ROLLED_BACK and "aborted by spec.rollout.abort=B" in w.status["abortReason"]


def test_manual_promote_skips_remaining_steps():
    w = world()
    w.tick()
    w.set_rollout(promote="B")
    w.tick()
    assert w.phase == PROMOTING and w.status["canaryWeight"] == 100
    w.tick()
    assert promoted(w)


def test_manual_pause_and_resume():
    w = world()
    w.tick()
    w.set_rollout(paused=True)
    for _ in range(60):
        w.tick()
    assert w.status["currentStepIndex"] == 0 and w.gate == ReleaseReason.PAUSED
    w.set_rollout(paused=False)
    w.run_until(promoted, max_ticks=100)


def test_returning_to_the_stable_revision_skips_analysis():
    w = world()
    w.tick()
    w.update = "A"
    p = w.tick()
    assert not p.in_release and p.canary_replicas == 0
    assert w.status["releaseHistory"][0]["result"] == "Cancelled"


def test_no_spare_gpu_auto_replaces_in_place():
    w = world()
    w.canary_health = "nogpu"
    # tick 1: surge asks for an extra canary pod; tick 2: it cannot be scheduled -> waiting for GPUs.
    w.tick()
    w.tick()
    assert w.gate == ReleaseReason.WAITING_FOR_GPUS and w.status["release"]["waitingForGPUs"]
    assert w.status["release"]["capacity"] == REPLACE_IN_PLACE
    # the next pass gives one stable pod's GPUs to the canary: stable 1 + canary 1 == 2 GPUs' worth.
    p = w.tick()
    assert (p.stable_replicas, p.canary_replicas) == (1, 1)
    # (the freed GPU lets the pod schedule) -> the release goes on and promotes; never a deadline rollback.
    w.canary_health = "ok"
    w.run_until(promoted, max_ticks=100)


def test_explicit_surge_waits_for_gpus_without_rolling_back():
    w = world(rollout={"gpuCapacity": "Surge"})
    w.canary_health = "nogpu"
    for _ in range(60):
        w.tick()
    assert w.phase == PROGRESSING and w.gate == ReleaseReason.WAITING_FOR_GPUS


def test_httproute_keeps_stable_full_size_and_weights_exact():
    w = world(traffic=HTTPROUTE, total=4)
    w.tick()
    p = w.tick()  # the canary pod is Ready: the route carries the step's exact weight
    assert (p.stable_replicas, p.canary_replicas, p.canary_weight) == (4, 1, 20)
    assert w.status["release"]["traffic"] == HTTPROUTE


def test_httproute_sends_the_canary_no_more_than_its_ready_pods_can_take():
    # A gateway sends a backend's share even when the backend has no Ready endpoint (Traefik answers 503
    # "no available server"): the route's canary weight waits for the canary pods of each step.
    w = world(traffic=HTTPROUTE, total=4)
    # tick 1: the release starts, its canary pod is not Ready yet -> weight 0, the status says 20 is next
    p = w.tick()
    assert (p.canary_replicas, p.routed_weight) == (1, 0)
    assert w.status["canaryWeight"] == 20 and w.status["release"]["effectiveWeight"] == 0
    # tick 2: the pod is Ready -> 20 %
    assert w.tick().routed_weight == 20
    # step 2 (50 %) needs 2 canary pods: 20 % stays on the Ready one until the second is Ready
    w.run_until(lambda w: w.status["currentStepIndex"] == 1, max_ticks=60)
    p = w.plans[-1]
    assert (p.canary_replicas, p.routed_weight) == (2, 20)
    assert w.tick().routed_weight == 50
    # a canary that never turns Ready never gets a request, up to its rollback
    w = world(traffic=HTTPROUTE, total=4)
    w.canary_health = "unready"
    w.run_until(lambda w: w.phase == ROLLED_BACK)
    assert {p.routed_weight for p in w.plans if p.canary_replicas} == {0}


def bg(**kw) -> World:
    rollout = {
        "strategy": "blueGreen",
        "blueGreen": {"autoPromotion": True, "scaleDownDelaySeconds": 10, "previewReplicas": 1},
    }
    rollout["blueGreen"].update(kw)
    return World(spec=spec_dict(**rollout))


def test_blue_green_promotion():
    w = bg()
    # tick 1: the preview (1 replica) starts; the active Service stays on A.
    p = w.tick()
    assert p.canary_replicas == 1 and p.active_revision == "A"
    # ticks: preview Ready, analysis passes -> preview grows to full size -> the active Service switches.
    w.run_until(lambda w: w.phase == SWITCHED)
    p = w.plans[-1]
    assert p.active_revision == "B" and p.stable_replicas == 2 and not p.stable_from_spec
    # scale-down delay 10 s: the old revision stays for an instant rollback, then stable moves to B.
    w.run_until(promoted, max_ticks=30)
    assert w.plans[-1].canary_replicas == 0


def test_blue_green_manual_promotion_waits():
    w = bg(autoPromotion=False)
    for _ in range(30):
        w.tick()
    assert w.gate == ReleaseReason.AWAITING_PROMOTION and w.plans[-1].active_revision == "A"
    w.set_rollout(promote="B")
    w.run_until(promoted, max_ticks=40)


def test_blue_green_pre_promotion_failure():
    w = bg()
    w.error_rate = 5.0
    w.run_until(lambda w: w.phase == ROLLED_BACK)
    p = w.plans[-1]
    assert p.active_revision == "A" and p.canary_replicas == 0 and "error rate 5% > 1%" in p.gate.message


def test_blue_green_crash_after_switch_switches_back_at_once():
    w = bg(scaleDownDelaySeconds=30)
    w.run_until(lambda w: w.phase == SWITCHED)
    w.canary_health = "crashloop"
    w.tick()  # the new active pods crash (seen by the next pass)
    w.tick()  # -> the active Service goes back to A at once; the old pods never left
    p = w.plans[-1]
    assert w.phase == ROLLED_BACK and p.active_revision == "A" and p.stable_replicas == 2


def test_a_spec_that_never_got_ready_is_fixed_without_a_release():
    w = world()
    w.status = {}  # the first revision never became Ready: no stableRevision
    p = w.tick()
    assert not p.in_release and p.stable_from_spec and p.canary_replicas == 0


# ---- sticky dialogues: the old revision drains its pinned dialogues before the promotion ----------------

DRAINING = ReleasePhase.DRAINING
STICKY = {"stickyDialogues": {"enabled": True, "idleSeconds": 30, "maxDrainSeconds": 120}}


def sticky(**kw) -> World:
    return world(traffic=HTTPROUTE, rollout=dict(STICKY), **kw)


def test_sticky_release_drains_the_old_revision_before_promoting():
    w = sticky(stable_requests=7)
    # ticks 1-40: steps 20 % and 50 % pass their pauses and analyses; the last step ends in the drain.
    w.run_until(lambda w: w.phase == DRAINING)
    p = w.plans[-1]
    # All new dialogues go to the canary; stable keeps the old revision at full size for the pinned ones.
    assert (p.canary_weight, p.stable_replicas, p.canary_replicas, p.stable_from_spec) == (100, 2, 2, False)
    assert w.stable.revision == "A" and w.gate == ReleaseReason.DRAINING
    # ticks: Prometheus says stable still served 7 requests in the idle window -> hold, and say so.
    for _ in range(30):
        w.tick()
    assert w.phase == DRAINING and w.dialogue_checks >= 2
    assert w.status["release"]["oldRevisionRequests"] == 7
    assert "7 requests in the last 30s" in w.plans[-1].gate.message
    # the pinned dialogues end: the next check reads 0 -> promotion (stable takes B), an event says why.
    w.stable_requests = 0
    w.run_until(lambda w: w.phase == PROMOTING or promoted(w), max_ticks=15)
    reasons = [e.reason for p in w.plans for e in p.events]
    assert ReleaseReason.DRAINED in reasons and ReleaseReason.DRAIN_TIMED_OUT not in reasons
    w.run_until(promoted)


def test_sticky_drain_ends_at_max_drain_seconds_and_counts_what_moved():
    w = sticky(stable_requests=4)
    w.run_until(lambda w: w.phase == DRAINING)
    # tick by tick: never 0 -> the drain ends on its bound, 120 s after it began.
    started = w.now
    w.run_until(lambda w: w.phase != DRAINING, max_ticks=200)
    assert 119 <= (w.now - started).total_seconds() <= 122
    warnings = [e for p in w.plans for e in p.events if e.reason == ReleaseReason.DRAIN_TIMED_OUT]
    assert len(warnings) == 1 and warnings[0].type == "Warning" and "4 requests" in warnings[0].message
    w.run_until(promoted)
    assert w.status["releaseHistory"][0]["result"] == "Promoted"


def test_sticky_drain_holds_while_prometheus_is_down_up_to_its_bound():
    w = sticky()
    w.run_until(lambda w: w.phase == DRAINING)
    w.prometheus_up = False
    for _ in range(60):
        w.tick()
    assert w.phase == DRAINING
    assert "not measured (Prometheus at http://prom did not answer" in w.plans[-1].gate.message
    w.run_until(lambda w: w.phase != DRAINING, max_ticks=100)
    assert any(e.reason == ReleaseReason.DRAIN_TIMED_OUT for e in w.plans[-1].events)


def test_abort_while_draining_rolls_back_to_the_old_revision():
    w = sticky(stable_requests=3)
    w.run_until(lambda w: w.phase == DRAINING)
    w.set_rollout(abort="B")
    p = w.tick()
    assert w.phase == ROLLED_BACK and p.canary_replicas == 0 and w.stable.revision == "A"


def test_promote_intent_skips_the_drain():
    w = sticky(stable_requests=3)
    w.run_until(lambda w: w.phase == DRAINING)
    w.set_rollout(promote="B")
    w.run_until(promoted, max_ticks=20)


def test_no_drain_without_sticky_dialogues_or_without_a_route():
    for w in (world(traffic=HTTPROUTE), world(rollout=dict(STICKY))):
        w.run_until(promoted)
        assert DRAINING not in [p.release.phase for p in w.plans if p.release is not None]


def test_no_drain_in_place_where_stable_is_gone_at_full_weight():
    w = sticky(stable_requests=3)
    w.set_rollout(gpuCapacity=REPLACE_IN_PLACE)
    w.run_until(promoted)
    assert DRAINING not in [p.release.phase for p in w.plans if p.release is not None]


# ---- rollback: make before break ---------------------------------------------------------------------


def test_rollback_at_full_canary_weight_keeps_the_canary_until_stable_serves_again():
    # ReplicaRatio at the last step (100 %): the stable track has no pod left.
    from chatfleet_operator.converge.facts import Track

    w = world(total=2)
    w.run_until(lambda w: w.plans[-1].stable_replicas == 0 and w.canary.ready == 2)
    w.set_rollout(abort="B")
    # tick: rolled back; stable asked back to 2, none Ready yet -> the canary keeps both pods, all traffic.
    w._apply = lambda plan: None  # the cluster is slow: nothing changes until the ticks below say so
    p = w.tick()
    assert w.plans[-1].release.phase == ROLLED_BACK
    assert (p.stable_replicas, p.canary_replicas, p.canary_weight) == (2, 2, 100)
    w.status = {**w.status, **p.status_fields("B").fields}
    # tick: one stable pod Ready -> one canary pod left, half the route's weight.
    w.stable = Track("A", 2, 1, exists=True)
    p = w.tick()
    assert (p.canary_replicas, p.canary_weight) == (1, 50)
    # tick: stable at full size -> the canary goes.
    w.stable = Track("A", 2, 2, exists=True)
    p = w.tick()
    assert (p.canary_replicas, p.canary_weight) == (0, 0)


def test_rollback_right_after_stable_was_scaled_to_zero_keeps_the_canary_while_the_old_pods_linger():
    """The abort comes in the pass after the move to 100 %: the stable Deployment asks 0 pods, but the
    controllers have not deleted its pods yet, so they still look Ready. They are going: counted as
    stable's, the canary went at once too, and the Service had nothing Ready until new stable pods
    loaded their model (the zero-drop real-pod test's refused connections and 503s in its rollback)."""
    from chatfleet_operator.converge.facts import PodFacts, observe_track

    w = world(total=2)
    w.run_until(lambda w: w.plans[-1].stable_replicas == 0 and w.canary.ready == 2)
    w.set_rollout(abort="B")
    w._apply = lambda plan: None
    lingering = [PodFacts(f"s-{i}", "A", "stable", "Running", True) for i in range(2)]
    template = {"metadata": {"labels": {"chatfleet.io/revision": "A"}}}
    w.stable = observe_track({"spec": {"replicas": 0, "template": template}}, lingering, "stable")
    p = w.tick()
    assert w.plans[-1].release.phase == ROLLED_BACK
    assert (p.stable_replicas, p.canary_replicas, p.canary_weight) == (2, 2, 100)
    # once stable asks for its pods again and they are Ready (kept, or new), the canary goes
    w.status = {**w.status, **p.status_fields("B").fields}
    w.stable = observe_track({"spec": {"replicas": 2, "template": template}}, lingering, "stable")
    assert w.tick().canary_replicas == 0


def test_a_tracks_ready_pods_are_counted_up_to_what_its_deployment_asks():
    from chatfleet_operator.converge.facts import PodFacts, observe_track

    template = {"metadata": {"labels": {"chatfleet.io/revision": "A"}}}
    pods = [PodFacts(f"s-{i}", "A", "stable", "Running", True) for i in range(3)]
    pods.append(PodFacts("s-3", "A", "stable", "Running", True, deleting=True))

    def ready(replicas: int) -> int:
        return observe_track({"spec": {"replicas": replicas, "template": template}}, pods, "stable").ready

    assert [ready(n) for n in (0, 1, 3, 5)] == [0, 1, 3, 3]


# ---- behind a route, the canary's pods outlive the route change by route_settle_seconds ----------------


def test_after_promotion_the_canary_stays_until_the_route_has_moved():
    w = world(traffic=HTTPROUTE, route_settle=10)
    w.run_until(promoted)
    # the pass that promotes: the route goes all to stable, the canary keeps its pods for 10 s
    p = w.plans[-1]
    assert (p.in_release, p.canary_weight, p.canary_replicas, p.requeue_after) == (False, 0, 2, 10)
    w.tick(4)
    assert (w.plans[-1].canary_replicas, w.plans[-1].requeue_after) == (2, 6)
    w.tick(6)
    assert w.plans[-1].canary_replicas == 0


def test_after_rollback_the_canary_stays_until_the_route_has_moved():
    w = world(traffic=HTTPROUTE, route_settle=10, total=4)
    w.run_until(lambda w: w.canary.ready >= 1 and w.phase == PROGRESSING)
    w.set_rollout(abort="B")
    p = w.tick()
    # weight 0 at once (stable is at full size behind the route), the pods a moment later
    assert w.phase == ROLLED_BACK and (p.canary_weight, p.canary_replicas) == (0, w.canary.replicas)
    w.tick(10)
    assert w.plans[-1].canary_replicas == 0


def long_step_world() -> World:
    """One 60 s step at 50%, then 100%: long enough for a pod to go well after the step began."""
    return world(rollout={"steps": [{"weight": 50, "pauseSeconds": 60}, {"weight": 100, "pauseSeconds": 0}]})


def test_a_canary_pod_lost_long_after_its_step_began_gets_the_deadline_to_come_back():
    w = long_step_world()
    # ticks 1-40: the canary Ready, 40 s into its 60 s step (past the 30 s deadline since the step began);
    # the deadline's clock is stopped while it is Ready, so status does not change a pass for it.
    w.run_until(lambda w: w.now.second == 40)
    assert w.status["release"]["canaryReadyAt"] and "readyDeadlineFrom" not in w.status["release"]
    # tick 41: its node goes; the pass that finds 0/1 Ready starts the clock instead of rolling back.
    w.canary_health = "unready"
    w.tick()
    w.tick()
    assert w.phase == PROGRESSING and w.status["release"]["readyDeadlineFrom"] == "2026-11-21T10:00:42Z"
    # 20 s later (inside the 30 s) a new pod is Ready elsewhere: the clock stops, the release promotes.
    for _ in range(20):
        assert w.tick() and w.phase == PROGRESSING
    w.canary_health = "ok"
    w.run_until(promoted)
    assert w.status["releaseHistory"][0]["result"] == "Promoted"


def test_a_canary_pod_that_does_not_come_back_rolls_back_a_deadline_after_it_went():
    w = long_step_world()
    w.run_until(lambda w: w.now.second == 40)
    w.canary_health = "unready"
    n = w.run_until(lambda w: w.phase == ROLLED_BACK)
    # the loss is seen at tick 42 (the pass after the pod went); the rollback comes 30 s after, not at once
    assert 30 <= n <= 33, n
    assert "0/1 pods Ready after progressDeadlineSeconds (30s)" in w.status["abortReason"]
