"""ChatbotService watch events -> passes, and retries: no kopf bookkeeping, no hot loop, one retry timer.

Test design: a Controller whose pass (`_timed_pass`, run in its worker thread) is replaced by a recorder
that returns a chosen Outcome; the ChatbotService bodies sit in the watch cache (kopf's index is a plain
mapping here). The events are what kopf hands the handler: type None for the start-up listing, then
ADDED / MODIFIED / DELETED.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from chatfleet_operator import api
from chatfleet_operator.converge.diagnose import Problem
from chatfleet_operator.reconcile import Outcome
from operator_helpers import DEBOUNCE, ScriptedController, cbs_body

KEY = ("ns", "bot")


class Recorder(ScriptedController):
    """Passes record the generation they ran on (see the `passes` fixture) and return one outcome."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome
        self.ran: list[int] = []

    def see(self, event_type: str | None, body: dict[str, Any]) -> None:
        """The watch delivers an event: the cache holds the body, then the handler runs."""
        self.cache[KEY] = [body]
        self.cbs_event(event_type, body)


@pytest.fixture(autouse=True)
def passes(monkeypatch):
    """reconcile_pass (run by the real _timed_pass in a worker thread) records and returns the outcome."""

    def recorded(controller: Recorder, body: dict[str, Any], *_: Any) -> Outcome:
        controller.ran.append(body["metadata"]["generation"])
        return controller.outcome

    monkeypatch.setattr("chatfleet_operator.controller.reconcile_pass", recorded)


def body(generation: int, observed: int | None = None, rv: int = 1) -> dict[str, Any]:
    out = cbs_body(generation=generation)
    out["metadata"]["resourceVersion"] = str(rv)
    if observed is not None:
        out["status"] = {"observedGeneration": observed}
    return out


CONVERGED = Outcome(problems=[], writes=0, status={})
STALLED = Outcome(
    problems=[Problem(api.Reason.SECRET_NOT_FOUND, "spec.runtime.sessions.redis.secretName: no Secret r")],
    writes=0,
    status={},
)


def test_listing_at_start_up_runs_one_pass_even_when_reconciled():
    controller = Recorder(CONVERGED)

    async def scenario() -> None:
        controller.see(None, body(3, observed=3))  # a restarted operator checks every object once
        await controller.settle()

    asyncio.run(scenario())
    assert controller.ran == [3]


def test_a_new_generation_runs_one_pass_and_the_status_echo_none():
    controller = Recorder(CONVERGED)

    async def scenario() -> None:
        controller.see("ADDED", body(1, rv=1))
        await controller.settle()
        controller.see("MODIFIED", body(1, observed=1, rv=2))  # the watch echo of the pass's status write
        await controller.settle()
        controller.see("MODIFIED", body(2, observed=1, rv=3))  # a spec change
        controller.see("MODIFIED", body(2, observed=1, rv=4))  # ... and a label edit right after: merged
        await controller.settle()

    asyncio.run(scenario())
    assert controller.ran == [1, 2]


def test_a_failing_generation_is_retried_by_the_timer_not_by_its_own_status_writes():
    """Each failed pass writes a status that is not observedGeneration (ReconcileError); the echo of that
    write must not start another pass (a hot loop), only the backoff timer does."""
    controller = Recorder(STALLED)

    async def scenario() -> int:
        controller.see("ADDED", body(1, rv=1))
        await controller.settle()
        controller.see("MODIFIED", body(1, rv=2))  # status written, observedGeneration still absent
        controller.see("MODIFIED", body(1, rv=3))
        await controller.settle()
        return len(controller._retries)

    timers = asyncio.run(scenario())
    assert controller.ran == [1]
    assert timers == 1


def test_passes_with_a_problem_keep_one_retry_timer_whose_delay_grows():
    controller = Recorder(STALLED)

    async def scenario() -> tuple[int, list[float]]:
        controller.see("ADDED", body(1, rv=1))
        delays = []
        for _ in range(3):  # child events trigger more passes while the retry waits
            await controller.settle()
            delays.append(controller._retries[KEY].when() - asyncio.get_running_loop().time())
            controller.trigger(KEY)
        await controller.settle()
        return len(controller._retries), delays

    timers, delays = asyncio.run(scenario())
    assert controller.ran == [1, 1, 1, 1]
    assert timers == 1
    assert 25 < delays[0] <= 30 and 55 < delays[1] <= 60 and 115 < delays[2] <= 120


def test_a_converged_pass_cancels_the_retry_and_a_deletion_forgets_the_object():
    controller = Recorder(STALLED)

    async def scenario() -> tuple[int, int, int]:
        controller.see("ADDED", body(1, rv=1))
        await controller.settle()
        stalled = len(controller._retries)
        controller.outcome = CONVERGED
        controller.see("MODIFIED", body(2, observed=1, rv=2))  # the user fixed the spec
        await controller.settle()
        converged = len(controller._retries) + len(controller._failures)
        controller.outcome = STALLED
        controller.see("MODIFIED", body(3, observed=2, rv=3))
        await controller.settle()
        controller.see("DELETED", body(3, observed=2, rv=4))
        return stalled, converged, len(controller._retries) + len(controller._failures)

    stalled, converged, deleted = asyncio.run(scenario())
    assert (stalled, converged, deleted) == (1, 0, 0)
    assert controller.ran == [1, 2, 3]


def crd(group: str, plural: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{plural}.{group}"}, "spec": {"group": group}}


def test_gateway_api_or_keda_crds_appearing_run_every_chatbotservice_again(monkeypatch):
    """A steady ChatbotService must learn that the cluster now serves Gateway API (an HTTPRoute) or KEDA
    (a ScaledObject) without a change of its own; other CRDs and start-up's listing change nothing."""
    monkeypatch.setattr("chatfleet_operator.controller.REDISCOVER_DELAY", DEBOUNCE)
    controller = Recorder(CONVERGED)
    forgotten = []
    monkeypatch.setattr(controller.releases, "rediscover", lambda: forgotten.append("gateway"))
    monkeypatch.setattr(controller.autoscaling, "rediscover", lambda: forgotten.append("keda"))

    async def scenario() -> list[list[int]]:
        controller.see("ADDED", body(1, rv=1))
        await controller.settle()
        controller.see("MODIFIED", body(1, observed=1, rv=2))  # steady: no pass
        await controller.settle()
        seen = [list(controller.ran)]
        controller.crd_event(None, crd("gateway.networking.k8s.io", "httproutes"))  # start-up listing
        controller.crd_event("ADDED", crd("example.com", "widgets"))
        await controller.settle()
        seen.append(list(controller.ran))
        controller.crd_event("ADDED", crd("gateway.networking.k8s.io", "httproutes"))
        await controller.settle()
        seen.append(list(controller.ran))
        controller.crd_event("DELETED", crd("keda.sh", "scaledobjects"))
        await controller.settle()
        seen.append(list(controller.ran))
        return seen

    seen = asyncio.run(scenario())
    assert seen == [[1], [1], [1, 1], [1, 1, 1]]
    assert forgotten == ["gateway", "keda", "gateway", "keda"]


def node(name: str, product: str, gpus: str = "8") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": gpus}},
    }


def test_a_node_arriving_or_changing_retries_at_once_only_the_bots_waiting_for_a_node():
    """The node watch: a ChatbotService stalled on placement (no node of its product, too few GPUs) runs
    again at once when a node appears or changes its GPUs, long before its retry timer (30 s here);
    one stalled on anything else does not, and a node event that changes nothing runs no pass."""
    placement = Outcome(
        problems=[Problem(api.Reason.NO_MATCHING_GPU_NODES, "No schedulable node has gpu.product=X")],
        writes=0,
        status={},
    )

    async def scenario(outcome: Outcome) -> list[list[int]]:
        controller = Recorder(outcome)
        controller.see("ADDED", body(1, rv=1))
        await controller.settle()
        seen = [list(controller.ran)]
        controller.node_event("ADDED", node("gpu-1", "NVIDIA-GB300"))
        await controller.settle()
        seen.append(list(controller.ran))
        controller.node_event("MODIFIED", node("gpu-1", "NVIDIA-GB300"))  # a heartbeat: nothing new
        await controller.settle()
        seen.append(list(controller.ran))
        controller.node_event("MODIFIED", node("gpu-1", "NVIDIA-GB300", gpus="4"))
        await controller.settle()
        seen.append(list(controller.ran))
        for timer in controller._retries.values():
            timer.cancel()
        return seen

    assert asyncio.run(scenario(placement)) == [[1], [1, 1], [1, 1], [1, 1, 1]]
    assert asyncio.run(scenario(STALLED)) == [[1], [1], [1], [1]]
