"""kopf's orchestrator waiting on watchers it stopped: warned, and the liveness probe fails past its limit.

While kopf's orchestrator waits for watchers it cancelled (a namespace deleted, a kind gone), it holds its
view of the cluster and takes in no new namespace and no CRD change; kopf says so only at debug level.
Driven through kopf's own `aiotasks.stop`, called as the orchestrator calls it, on a watcher that does
not end when cancelled (what a swallowed cancellation left in CI), with the operator's filter installed.
"""

from __future__ import annotations

import asyncio
import logging

import kopf
import pytest
from chatfleet_operator import kopfext
from kopf._cogs.aiokits import aiotasks
from kopf._core.reactor import orchestration


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stops(caplog, monkeypatch):
    """The operator's filter on kopf's orchestration logger, installed as cli.py does (after kopf's log
    set-up, at info level), with a clock the test moves, and the one main.py's probe reads; removed after."""
    logger = logging.getLogger(kopfext.ORCHESTRATION_LOGGER)
    level = logger.level
    clock = Clock()
    caplog.set_level(logging.INFO)
    watch = kopfext.OrchestratorStops(clock).install()
    monkeypatch.setattr(kopfext, "ORCHESTRATOR_STOPS", watch)
    try:
        yield watch, clock
    finally:
        logger.removeFilter(watch)
        logger.setLevel(level)


async def stop_a_stubborn_watcher(watch, clock, seen: list[float]) -> None:
    """kopf stops a watcher that ignores its cancellation until released; `seen` gets held_seconds() once
    kopf has said twice that it is still waiting, then the watcher is let go."""
    release = asyncio.Event()

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if release.is_set():
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    # the orchestrator's own call (terminate_redundancies), its 10 s interval shortened
    stopping = asyncio.create_task(
        aiotasks.stop({task}, title="streaming", logger=orchestration.logger, interval=0.05, quiet=True)
    )
    for _ in range(500):  # kopf says it is still waiting every 0.05 s
        if watch.since is not None:
            break
        await asyncio.sleep(0.01)
    clock.now += 55.0
    seen.append(watch.held_seconds())
    release.set()
    task.cancel()
    await stopping
    seen.append(watch.held_seconds())


def test_kopf_waiting_on_a_watcher_it_stopped_is_a_warning_and_ends_when_it_does(stops, caplog):
    watch, clock = stops
    seen: list[float] = []
    asyncio.run(stop_a_stubborn_watcher(watch, clock, seen))
    warned = [r for r in caplog.records if r.name == kopfext.ORCHESTRATION_LOGGER]
    assert warned and {r.levelno for r in warned} == {logging.WARNING}, [r.getMessage() for r in warned]
    assert "watches no new namespace or CRD" in warned[0].getMessage()
    # kopf says so first once it has waited 10 s: counted from then; and over once the watcher ended
    assert seen == [65.0, 0.0]


def test_kopfs_other_debug_records_stay_out_of_the_log(stops, caplog):
    orchestration.logger.debug("Streaming tasks are stopped: finishing normally; tasks left: set()")
    orchestration.logger.debug("something else kopf says at debug level")
    orchestration.logger.info("kopf's own info")
    assert [r.getMessage() for r in caplog.records] == ["kopf's own info"]


def test_the_liveness_probe_fails_past_the_limit(stops):
    from chatfleet_operator import main

    watch, clock = stops
    assert asyncio.run(main.watchers_probe()) == 0.0
    watch.since = clock.now - 30.0
    assert asyncio.run(main.watchers_probe()) == 30.0
    watch.since = clock.now - kopfext.STOPS_FAIL_SECONDS
    with pytest.raises(kopf.PermanentError, match="waited 60 s"):
        asyncio.run(main.watchers_probe())


def test_the_probe_is_registered_to_fail_at_once():
    """A permanent failure: kopf's /healthz then answers 500 at once, not after retries within the request."""
    from chatfleet_operator import main  # noqa: F401  (registers the handlers)
    from kopf._core.intents import causes

    registry = kopf.get_default_registry()
    (probe,) = [h for h in registry._activities.get_handlers(activity=causes.Activity.PROBE)]
    assert probe.id == "watchers" and probe.errors == kopf.ErrorsMode.PERMANENT


def test_kopfs_health_check_fails_with_the_probe(stops):
    """What kopf's /healthz runs on each request (its health reporter answers 500 when this raises)."""
    from chatfleet_operator import main  # noqa: F401  (registers the handlers)
    from kopf._cogs.configs import configuration
    from kopf._cogs.structs import ephemera
    from kopf._core.actions import lifecycles
    from kopf._core.engines import activities
    from kopf._core.intents import causes

    watch, clock = stops

    def health() -> dict:
        return asyncio.run(
            activities.run_activity(
                lifecycle=lifecycles.all_at_once,
                registry=kopf.get_default_registry(),
                settings=configuration.OperatorSettings(),
                activity=causes.Activity.PROBE,
                indices={},
                memo=ephemera.Memo(),
            )
        )

    assert health() == {"watchers": 0.0}
    watch.since = clock.now - kopfext.STOPS_FAIL_SECONDS - 5
    with pytest.raises(activities.ActivityError) as failed:
        health()
    assert isinstance(failed.value.outcomes["watchers"].exception, kopf.PermanentError)
