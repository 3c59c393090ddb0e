"""kopf tuning for event handlers only, two repairs of kopf's watchers: the start-up gate, and a watched
kind whose CustomResourceDefinition is deleted; the lean watcher (kopflean.py) started in place of kopf's
for the kinds main.py declared; a faster decoder of its watch streams; and watches on that gate and on the
orchestrator's stops of watchers (no API calls here)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import kopf
import orjson
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients.errors import APINotFoundError
from kopf._core.reactor import queueing

from chatfleet_operator import kopflean

log = logging.getLogger("chatfleet")

#: Seconds a watcher waits before it watches again after the API server answered 404 for its kind,
#: one per attempt, the last repeated.
GONE_RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)

#: kopf's own watcher (kopf 1.45.2), wrapped by `watcher_that_releases_its_gates`.
_KOPF_WATCHER = queueing.watcher

#: Seconds between two looks at kopf's start-up gate, and how long it may stay shut before each look warns
#: (normally seconds: the gate opens once every watch has listed and indexed what it listed).
GATE_SAMPLE_SECONDS = 10.0
GATE_WARN_SECONDS = 60.0

#: kopf's "all indexed" set of this process (one per kopf run), as its watchers' wrappers saw it; None
#: before the first watcher starts.
_indexed: Any = None


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: the operator registers event and index handlers only, never change handlers.

    kopf builds every event's "essence" (a deep copy of the whole body, managedFields included) and
    diffs it against the stored one, whatever handlers exist; only change handlers ever read them. With
    1,000 ChatbotServices that copy was a fifth of the operator's CPU. `main.py` registers no change
    handler (tests/unit/operator/test_operator_kopfext.py checks), so nothing is lost.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        """No essence."""
        return None

    def fetch(self, *, body: kopf.Body) -> Any:
        """No stored essence."""
        return None

    def store(self, *, body: kopf.Body, patch: Any, essence: Any) -> None:
        """Nothing to store."""


def decode(text: str | bytes) -> Any:
    """One JSON document decoded by orjson, or by Python's `json` where orjson refuses it (NaN, Infinity):
    the same objects either way, and the same error for what neither reads. One difference, never met in
    what the API server sends (its numbers are int64 or float64): orjson reads an integer beyond 64 bits
    as a float."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


class _WatchJson:
    """What kopf's api module sees as its `json`: it only ever calls `json.loads`, once per watch event."""

    loads = staticmethod(decode)


def decode_watch_streams_faster() -> None:
    """Make kopf decode each watch event with `decode` (orjson) instead of Python's `json`.

    kopf 1.45.2's watch stream (`kopf._cogs.clients.api.stream`) decodes every line with its module's
    `json.loads`. With 1,000 ChatbotServices that decoding of pods, Deployments and ChatbotServices was
    37 % of the operator's CPU (docs/benchmarks.md, bench-operator's profile); orjson reads the same
    objects in about half the time. Lists (start-up) go through aiohttp's decoder, untouched.
    """
    kopf_api.json = _WatchJson  # type: ignore[assignment]


class _GatesMadeBy:
    """kopf's "all indexed" toggle set as one watcher sees it: the gates it opens are remembered, and
    adding or dropping one wakes the tasks waiting on the set only when the set's state changes.

    kopf's own ToggleSet wakes every waiter on every added or dropped gate. At start-up each listed
    object gets a gate, and each object's worker, once it has indexed its object, drops its gate and
    waits for the whole set: N objects, N waiters, N drops, so N^2 wake-ups (each re-checking the set).
    A restarted operator over 3,000 ChatbotServices (12,000 watched objects) spent minutes of a whole
    core in them before its first pass. The waiters wait for the set's state only (on: every gate
    open), so a change that leaves the state as it was needs to wake no one (kopf 1.45.2's ToggleSet:
    its `_condition` and `_toggles`, which this class reaches into).
    """

    def __init__(self, toggles: Any) -> None:
        global _indexed
        _indexed = toggles
        self._toggles = toggles
        self.made: set[Any] = set()

    async def make_toggle(self, state: bool = False, *, name: str | None = None) -> Any:
        """Make a gate in the real set (waking the waiters only if that changes the set's state), and
        remember it."""
        toggle = aiotoggles.Toggle(state, name=name, condition=self._toggles._condition)
        await self._change(lambda gates: gates.add(toggle))
        self.made.add(toggle)
        return toggle

    async def drop_toggle(self, toggle: Any) -> None:
        """Drop a gate (waking the waiters only if that changes the set's state)."""
        await self._change(lambda gates: gates.discard(toggle))

    async def drop_toggles(self, toggles: Any) -> None:
        """Drop gates (waking the waiters only if that changes the set's state)."""
        await self._change(lambda gates: gates.difference_update(toggles))

    async def release(self, resource_indexed: Any) -> None:
        """Drop every gate made so far and the watcher's own (`resource_indexed`, None: none): a watch
        that ended can index nothing more, and kopf's watcher has closed its objects' workers."""
        made, self.made = self.made, set()
        await self.drop_toggles(made | ({resource_indexed} - {None}))

    async def _change(self, edit: Any) -> None:
        real = self._toggles
        async with real._condition:
            before = real.is_on()
            edit(real._toggles)
            if real.is_on() != before:
                real._condition.notify_all()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._toggles, name)


async def watcher_that_releases_its_gates(
    *, operator_indexed: Any = None, resource_indexed: Any = None, **kwargs: Any
) -> None:
    """kopf's watcher, which on exit drops the indexing gates it (or its orchestrator) made for it.

    kopf runs no handler until every (resource, namespace) watcher has listed and every listed object
    was indexed once; each has a gate in `operator_indexed`. When a watched namespace disappears while
    the operator starts, kopf stops that namespace's watchers, but their gates stay shut, and the
    operator never runs a handler again (kopf 1.45.2). A stopped watcher can index nothing more, so
    its gates are dropped when it ends. Dropping a gate already dropped is a no-op.
    """
    if operator_indexed is None:  # peering observers: no gates to release
        await watch_through_a_removed_kind(resource_indexed=resource_indexed, **kwargs)
        return
    gates = _GatesMadeBy(operator_indexed)
    try:
        await watch_through_a_removed_kind(
            operator_indexed=gates, resource_indexed=resource_indexed, **kwargs
        )
    finally:
        await gates.release(resource_indexed)


async def watch_through_a_removed_kind(**kwargs: Any) -> None:
    """kopf's watcher, watching again (after GONE_RETRY_SECONDS) when the API server answers 404 for
    the watched kind, instead of stopping the operator.

    When a CustomResourceDefinition the operator watches is deleted (a gateway's CRDs uninstalled,
    Traefik's, the Inference Extension's), the API server ends the kind's watch streams; kopf's watcher
    reconnects at once, and if that request comes before kopf's CRD observer has stopped the watcher it
    gets a 404, which kopf 1.45.2 treats as fatal: the whole operator exited (seen on the local
    platform, with every fleet then left unreconciled). A kind that is gone for good is then stopped
    by the observer, which cancels this task while it waits; one that comes back is watched again.
    While it waits, the kind holds no gate of kopf's start-up: it has nothing to index, and the
    operator's handlers of every other kind go on. That includes the gates of objects it had listed
    whose workers kopf's watcher closed at the 404 before they indexed them: while kopf's discovery
    still lists a deleted kind, the watcher 404s every 30 s for good, and one such gate left shut held
    every handler of the operator (its integration suite's operator reconciled nothing for minutes once
    a Traefik module had uninstalled its CRDs).

    A watcher cancelled while it handles the 404 stops: kopf's watcher waits for its object workers under
    `contextlib.suppress(asyncio.CancelledError)`, so a cancellation that lands then is swallowed and the
    404 raised instead. Watched again, that watcher never ended, kopf's orchestrator waited for it for
    good (holding its insights, so no CRD or namespace change was taken in again), and no ChatbotService
    of a namespace created after that was ever reconciled (seen in CI: the integration suite's operator,
    after a Traefik module and KEDA's test had removed their CRDs).
    """
    resource, indexed, gate = (kwargs.get(k) for k in ("resource", "operator_indexed", "resource_indexed"))
    task = asyncio.current_task()
    for attempt in itertools.count():
        try:
            await _watcher_of(kwargs)(**kwargs)
            return
        except APINotFoundError:
            if isinstance(indexed, _GatesMadeBy):
                await indexed.release(gate)
            if task is not None and task.cancelling():
                # kopf's watcher swallows a cancellation that arrives while it closes its workers, then
                # raises the 404 that made it close them: the orchestrator's cancellation is this one
                raise asyncio.CancelledError from None
            delay = GONE_RETRY_SECONDS[min(attempt, len(GONE_RETRY_SECONDS) - 1)]
            log.warning(
                "The API server does not serve %s (404: its CustomResourceDefinition deleted?); "
                "watching it again in %.0f s unless it is gone for good",
                resource,
                delay,
            )
            await asyncio.sleep(delay)


def _watcher_of(kwargs: dict[str, Any]) -> Callable[..., Any]:
    """kopf's watcher, or the lean one (kopflean.py) for a kind main.py declared lean."""
    lean = kopflean.lean_for(kwargs.get("resource"), kwargs.get("processor"))
    return _KOPF_WATCHER if lean is None else functools.partial(kopflean.watch, lean=lean)


def repair_index_gates() -> None:
    """Make kopf's orchestrator start `watcher_that_releases_its_gates` (call before kopf starts)."""
    queueing.watcher = watcher_that_releases_its_gates


def shut_gates() -> list[str]:
    """The names of kopf's start-up gates still shut ("<kind>@<namespace>" for a watch that has not listed,
    "(<kind>, <uid>)" for an object not indexed yet), sorted; empty when all are open or before kopf runs."""
    if _indexed is None:
        return []
    return sorted(str(gate.name or gate) for gate in list(_indexed) if not gate.is_on())


#: The logger of kopf's orchestrator, which starts and stops a watcher per watched kind and namespace.
ORCHESTRATION_LOGGER = "kopf._core.reactor.orchestration"
#: What kopf 1.45.2 logs (debug level) every _STOPS_LOG_SECONDS while watchers it cancelled have not
#: ended, and once they have.
_STOPS_PENDING = "Streaming tasks are not stopped"
_STOPS_DONE = "Streaming tasks are stopped"
_STOPS_LOG_SECONDS = 10.0
#: Seconds kopf's orchestrator may wait for watchers it stopped before the liveness probe fails (it waits
#: seconds at most: a watcher gives its object workers 2 s, then cancels them).
STOPS_FAIL_SECONDS = 60.0


class OrchestratorStops(logging.Filter):
    """How long kopf's orchestrator has waited for watchers it cancelled, read from its debug log.

    While it waits it holds its view of the cluster, so it takes in no new namespace and no CRD change:
    ChatbotServices of a namespace created meanwhile are never reconciled. kopf says so only at debug
    level; this filter on its logger raises those records to warnings that say what it means, drops the
    logger's other debug records (unless the operator logs at debug level), and `held_seconds` feeds the
    liveness probe (main.py), so that the kubelet restarts an operator stuck so.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.since: float | None = None
        self.passing = logging.INFO

    def install(self, logger: logging.Logger | None = None) -> OrchestratorStops:
        """Filter kopf's orchestration logger, which then hands its debug records to this filter."""
        logger = logger or logging.getLogger(ORCHESTRATION_LOGGER)
        self.passing = logger.getEffectiveLevel()
        logger.setLevel(logging.DEBUG)
        logger.addFilter(self)
        return self

    def filter(self, record: logging.LogRecord) -> bool:
        """Raise kopf's "not stopped" records to warnings; pass what the logger passed before."""
        message = record.getMessage()
        if message.startswith(_STOPS_PENDING):
            if self.since is None:  # kopf says so first once it has waited _STOPS_LOG_SECONDS
                self.since = self.clock() - _STOPS_LOG_SECONDS
            record.msg = (
                "kopf has waited %.0f s for watchers it stopped to end, and watches no new namespace or "
                "CRD until they do (%s)"
            )
            record.args = (self.held_seconds(), message)
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            return True
        if message.startswith(_STOPS_DONE):
            self.since = None
        return record.levelno >= self.passing

    def held_seconds(self) -> float:
        """Seconds since kopf first said watchers it stopped had not ended (0.0: none pending)."""
        return 0.0 if self.since is None else self.clock() - self.since


#: The operator's one view of kopf's orchestrator stops (installed by cli.py, read by main.py's probe).
ORCHESTRATOR_STOPS = OrchestratorStops()


class GateWatch:
    """How long kopf has held every handler at its start-up gate, and by which gates, sampled.

    kopf runs no handler of any kind while one gate is shut: normal for the seconds a start or a new
    namespace takes to list, a stuck operator when it lasts (its log otherwise silent about why).
    """

    def __init__(self, gates: Callable[[], list[str]] = shut_gates) -> None:
        self._gates = gates
        self.shut_since: float | None = None
        self.names: list[str] = []

    def sample(self, now: float) -> float:
        """Look at the gates now; the seconds they have been held shut without a break (0.0: open)."""
        self.names = self._gates()
        if not self.names:
            self.shut_since = None
            return 0.0
        if self.shut_since is None:
            self.shut_since = now
        return now - self.shut_since

    def held_seconds(self, now: float | None = None) -> float:
        """Seconds held shut as of the last sample, counted to `now` (0.0 when open at the last sample)."""
        if self.shut_since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.shut_since

    async def run(self, period: float, warn_after: float) -> None:
        """Sample every `period` seconds; while held `warn_after` seconds or more, warn with the gates."""
        while True:
            held = self.sample(time.monotonic())
            if self.names and held >= warn_after:
                more = f" and {len(self.names) - 5} more" if len(self.names) > 5 else ""
                log.warning(
                    "kopf has held every handler for %.0f s at its start-up gate, until these watches have "
                    "listed and their objects are indexed: %s%s",
                    held,
                    ", ".join(self.names[:5]),
                    more,
                )
            await asyncio.sleep(period)
