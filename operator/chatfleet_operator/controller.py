"""The per-object controller: serializes passes per ChatbotService, coalesces watch events, retries.

Every pass comes from a watch event (kopf's event handlers, which keep no bookkeeping in the object):
a ChatbotService listed at start-up or with a generation no pass has run yet ("spec" lane, the larger
worker pool), an owned object, pod or node whose change matters, or a timer ("triggered" lane). A pass
that raises or reports a problem is retried here with a growing delay (`backoff_delay`), one retry
timer per object; a pass waiting on time (a release, a held progress status) has one timer per object
too, the earliest asked, dropped by any pass of the object.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from chatfleet_operator import api, metrics
from chatfleet_operator.analysis.provider import PrometheusProvider
from chatfleet_operator.autoscale.measure import Autoscaling
from chatfleet_operator.builders.httproute import GATEWAY_GROUP
from chatfleet_operator.builders.inferencepool import POOL_GROUP, POOL_VERSION
from chatfleet_operator.builders.scaledobject import KEDA_GROUP, KEDA_VERSION
from chatfleet_operator.cache import Key, Snapshot, World, resource_version
from chatfleet_operator.converge.facts import deployment_progress_only
from chatfleet_operator.reconcile import Outcome, PassFailed, reconcile_pass, record_error
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.settings import Settings
from chatfleet_operator.wave import UpgradeWave
from chatfleet_operator.writes import Client, Gone

log = logging.getLogger("chatfleet")

#: Problems a new or relabelled node can solve (node events retry these ChatbotServices at once).
PLACEMENT_REASONS = frozenset({api.Reason.NO_MATCHING_GPU_NODES, api.Reason.INSUFFICIENT_GPUS})


def backoff_delay(retry: int, base: float, ceiling: float) -> float:
    """Growing retry delay: base * 2**retry, capped; e.g. base 5: 5, 10, 20, 40, ... 300."""
    return float(min(ceiling, base * (2 ** min(retry, 16))))


@dataclass(frozen=True)
class Retry:
    """A pass to run again: after `delay` seconds, because of `why`."""

    delay: float
    why: str


@dataclass
class _Timing:
    """What run_pass learns from its worker thread: whether the pass started running, and for how long."""

    started: bool = False
    seconds: float | None = None


#: API groups whose CRDs appearing or going change what a pass writes.
REDISCOVER_GROUPS = frozenset({GATEWAY_GROUP, KEDA_GROUP, POOL_GROUP})
#: Seconds between such a CRD event and the passes it asks for (its Established status follows it).
REDISCOVER_DELAY = 2.0


class Controller:
    """Serializes passes per ChatbotService and coalesces bursts of watch events into one pass."""

    def __init__(
        self, settings: Settings, client: Client, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.settings = settings
        self.client = client
        self.world = World()
        serves = getattr(client, "serves_group", None)
        prometheus = PrometheusProvider(settings.prometheus)  # one CA, token and verification for both
        self.releases = Releases(
            settings.release,
            provider=prometheus,
            serves_gateway_api=(lambda: serves(GATEWAY_GROUP)) if serves else None,
            cluster_domain=settings.runtime.cluster_domain,
            serves_inference_pools=(lambda: serves(POOL_GROUP, POOL_VERSION)) if serves else None,
            read_config_map=getattr(client, "config_map_data", None),
        )
        source = settings.autoscale.metrics_source.lower()
        keda: Callable[[], bool] | None = (lambda: serves(KEDA_GROUP, KEDA_VERSION)) if serves else None
        if source in ("keda", "hpa"):
            keda = (lambda: True) if source == "keda" else (lambda: False)
        self.autoscaling = Autoscaling(
            serves_keda=keda,
            range_query=prometheus.query_range,
            instant_query=prometheus.query,
            settings=settings.release,
            cache_seconds=settings.release.discovery_cache_seconds,
            cluster_domain=settings.runtime.cluster_domain,
        )
        self.wave = UpgradeWave(settings.pod.upgrade_wave)
        self.clock = clock
        self.executor = ThreadPoolExecutor(
            max_workers=settings.runtime.workers, thread_name_prefix="reconcile"
        )
        # Triggered passes (mostly status updates) get their own threads, so a burst of creations does not
        # hold back the Ready of the ChatbotServices created first.
        self.trigger_executor = ThreadPoolExecutor(
            max_workers=max(4, settings.runtime.workers // 2), thread_name_prefix="triggered"
        )
        self._locks: dict[Key, asyncio.Lock] = {}
        self._pending: dict[Key, str] = {}
        """Keys with a pass coming (debounced), and the lane it runs in."""
        self._failures: dict[Key, int] = {}
        self._retries: dict[Key, asyncio.TimerHandle] = {}
        """The one retry timer of each object that failed or has a problem."""
        self._due: dict[Key, asyncio.TimerHandle] = {}
        """The one timer of each object's next pass on time (_pass_due_in): the earliest asked wins, and any
        pass of the object drops it (that pass asks again for what it still waits on)."""
        self._generations: dict[Key, int] = {}
        """The generation the last pass of each object started on (its spec changes trigger once)."""
        self._waiting_for_nodes: set[Key] = set()
        self._waiting_for_wave: set[Key] = set()
        """Fleets whose update from the operator waits for a place in the upgrade wave (wave.py)."""
        self._rediscovery: asyncio.TimerHandle | None = None
        """The one round of passes a burst of CRD events asks for (crd_event)."""
        self._passing: dict[Key, list[tuple[str, str, int]]] = {}
        """Objects whose pass is running, with the owned objects new to the watch seen meanwhile (kind,
        name, resourceVersion): each is the echo of that pass's own write, or triggers a pass when it ends."""

    def use_indexes(self, indexes: Mapping[str, Any]) -> None:
        """Keep references to kopf's index objects (they live as long as the operator)."""
        if not self.world.indexes:
            self.world.indexes = {k: v for k, v in indexes.items() if k.endswith("_index")}

    async def run_pass(
        self,
        key: Key,
        body: Mapping[str, Any] | None = None,
        executor: ThreadPoolExecutor | None = None,
        trigger: str = metrics.HANDLER,
    ) -> Outcome | None:
        """Run one pass for `key` under its lock, on the freshest cached body (counted in metrics.py)."""
        token = metrics.pass_asked()
        timing = _Timing()
        result: str | None = None
        try:
            outcome = await self._locked_pass(key, body, executor, timing)
            if outcome is not None:
                result = metrics.PROBLEM if outcome.problems else metrics.SUCCESS
            return outcome
        except Gone:
            result = metrics.GONE
            log.info("Skipped ChatbotService %s/%s: its namespace is being deleted", *key)
            return None
        except PassFailed:
            result = metrics.ERROR
            raise
        finally:
            metrics.pass_done(token, trigger, result, timing.seconds, timing.started)

    async def _locked_pass(
        self, key: Key, body: Mapping[str, Any] | None, executor: ThreadPoolExecutor | None, timing: _Timing
    ) -> Outcome | None:
        """The pass of run_pass under the object's lock; None when there is nothing to reconcile."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            body = self.world.body(key, body)
            if body is None or body.get("metadata", {}).get("deletionTimestamp"):
                return None
            self._generations[key] = body.get("metadata", {}).get("generation")
            due = self._due.pop(key, None)
            if due is not None:  # this pass does what the timer was for, or asks for it again
                due.cancel()
            snap = self.world.snapshot(key)
            loop = asyncio.get_running_loop()
            self._passing[key] = []
            try:
                outcome = await loop.run_in_executor(
                    executor or self.executor, self._timed_pass, body, snap, timing
                )
            finally:
                self._settle_new_children(key)
            if outcome.requeue_after:  # a release waits on time (a pause, the next measurement), a forecast,
                self._pass_due_in(key, outcome.requeue_after)  # a held progress status
            if outcome.wave_changed:
                self._wake_held(but=key)
            if outcome.upgrade_held:
                self._waiting_for_wave.add(key)
            else:
                self._waiting_for_wave.discard(key)
            if any(p.reason in PLACEMENT_REASONS for p in outcome.problems):
                self._waiting_for_nodes.add(key)
            else:
                self._waiting_for_nodes.discard(key)
            return outcome

    def _timed_pass(self, body: Mapping[str, Any], snap: Snapshot, timing: _Timing) -> Outcome:
        """One pass in a worker thread, timed into `timing` (seconds); a pass that raises -> PassFailed."""
        timing.started = True
        metrics.pass_running()
        started = time.monotonic()
        try:
            return reconcile_pass(
                self.client,
                body,
                snap,
                self.world,
                self.settings,
                self.clock(),
                self.releases,
                self.autoscaling,
                self.wave,
            )
        except Gone:
            raise
        except Exception as exc:
            meta = body.get("metadata", {})
            log.exception("Failed to reconcile ChatbotService %s/%s", meta.get("namespace"), meta.get("name"))
            try:
                record_error(self.client, body, self.world, exc, self.clock())
            except Exception as record_exc:  # e.g. the API server is down: the retry will tell again
                log.warning("Failed to record the error in the status: %s", record_exc)
            raise PassFailed(exc) from exc
        finally:
            timing.seconds = time.monotonic() - started

    def child_event(self, kind: str, event_type: str, body: Mapping[str, Any], key: Key | None) -> None:
        """A watch event of an owned object or pod: trigger the owner only when something that matters changed.

        A Deployment's rollout progress short of its goal (facts.deployment_progress_only) triggers the
        pass only once the owner's progress status could be written again (progress_status_seconds after
        its last status write): the pass would hold that write until then anyway, and a new fleet's
        Deployment reports its counts three or four times on the way to Ready.
        """
        if key is None:
            return
        seen = self.world.observe(kind, body, deleted=event_type == "DELETED")
        if seen is None:
            return
        before, after = seen
        new_during_a_pass = self._passing.get(key) if before is None and after is not None else None
        if new_during_a_pass is not None:  # most likely the echo of the running pass's own write
            meta = body.get("metadata", {})
            new_during_a_pass.append((kind, meta.get("name", ""), resource_version(body)))
            return
        if kind == "Deployment" and after is not None and deployment_progress_only(before, after):
            self._trigger_after_progress_hold(key)
        else:
            self.trigger(key)

    def _settle_new_children(self, key: Key) -> None:
        """At the end of a pass: the owned objects new to the watch during it that are not the echo of that
        pass's own write (the object at the resourceVersion the pass's write returned) trigger a pass.

        A pass creates its children with server-side applies from a worker thread; the watch event of each
        creation often reaches the event loop before the apply's response reaches the thread, so without
        this every such echo looked new and asked for a pass that had nothing to do (a third of a pass per
        new ChatbotService at 300 at once: docs/benchmarks.md, "where the passes go").
        """
        namespace = key[0]
        seen = self._passing.pop(key, [])
        if any(not self.world.wrote(kind, namespace, name, rv) for kind, name, rv in seen):
            self.trigger(key)

    def _trigger_after_progress_hold(self, key: Key) -> None:
        """Trigger a pass when the owner's progress status may be written again (at once if it may now):
        progress_status_seconds after its last status write, and not before the end of a hold its last pass
        set (a new ChatbotService's first status, converge/hold.py)."""
        now = self.clock()
        written = self.world.status_written_at(key)
        held = self.world.status_held_until(key)
        interval = self.settings.retry.progress_status_seconds
        wait = max(
            interval - (now - written).total_seconds() if written is not None else 0.0,
            (held - now).total_seconds() if held is not None else 0.0,
        )
        if wait <= 0:
            self.trigger(key)
        else:
            self._pass_due_in(key, wait)

    def _pass_due_in(self, key: Key, delay: float) -> None:
        """A pass of `key` in `delay` seconds, unless one is already due sooner (one timer per object)."""
        loop = asyncio.get_running_loop()
        due = self._due.get(key)
        if due is not None:
            if due.when() <= loop.time() + delay:
                return
            due.cancel()
        self._due[key] = loop.call_later(delay, self._pass_is_due, key)

    def _pass_is_due(self, key: Key) -> None:
        """The timer of one object's next pass went off."""
        self._due.pop(key, None)
        self.trigger(key)

    async def attempt(
        self,
        key: Key,
        body: Mapping[str, Any] | None = None,
        executor: ThreadPoolExecutor | None = None,
        trigger: str = metrics.HANDLER,
    ) -> Retry | None:
        """One pass and the retry it calls for: None when it converged (or there was nothing to do).

        A pass that raised or found a problem is retried after `base_delay * 2**n` (n: its failures in a
        row, capped at `max_delay`); an apply the API server may accept on a second try (5xx, 429, 409)
        after `1 s * 2**n`. A refused spec (a host path not allowed) is not retried: nothing but a new
        spec, which starts a pass of its own, or a restarted operator can change the answer.
        """
        failures = self._failures.get(key, 0)
        try:
            outcome = await self.run_pass(key, body, executor, trigger)
        except PassFailed as exc:
            why, base = f"Reconcile failed: {exc}", self.settings.retry.base_delay
        else:
            if outcome is None or not (outcome.problems or outcome.retry):
                self._failures.pop(key, None)
                return None
            if outcome.refused:  # a refused spec: its next generation (or a restart) runs the next pass
                self._failures.pop(key, None)
                log.info("Waiting for a new spec of ChatbotService %s/%s (refused, not retried)", *key)
                return None
            reasons = ", ".join(sorted({p.reason for p in outcome.problems})) or api.Reason.APPLY_FAILED
            why = f"Waiting for {reasons} to be resolved"
            base = 1.0 if outcome.retry else self.settings.retry.base_delay
        self._failures[key] = failures + 1
        return Retry(backoff_delay(failures, base, self.settings.retry.max_delay), why)

    def cbs_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A ChatbotService watch event: a pass when it is listed (start-up) or its spec is new to us."""
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.forget(key)
            return
        if meta.get("deletionTimestamp"):
            return
        generation = meta.get("generation")
        observed = (body.get("status") or {}).get("observedGeneration")
        new_spec = observed != generation and self._generations.get(key) != generation
        if event_type is None or new_spec:
            self.trigger(key, metrics.HANDLER)

    def trigger(self, key: Key | None, lane: str = metrics.TRIGGERED) -> None:
        """Ask for a pass soon (debounced); repeated asks before it runs are merged (a spec lane wins)."""
        if key is None:
            return
        if key in self._pending:
            if lane == metrics.HANDLER:
                self._pending[key] = lane
            return
        self._pending[key] = lane
        metrics.trigger_queued()
        loop = asyncio.get_running_loop()
        loop.call_later(self.settings.retry.trigger_debounce, lambda: loop.create_task(self._triggered(key)))

    async def _triggered(self, key: Key) -> None:
        """A debounced pass in its lane; a failure or problem schedules the object's one retry."""
        lane = self._pending.pop(key, metrics.TRIGGERED)
        metrics.trigger_due()
        executor = self.executor if lane == metrics.HANDLER else self.trigger_executor
        try:
            retry = await self.attempt(key, executor=executor, trigger=lane)
        except Exception as exc:  # not a pass failure (those are PassFailed): e.g. the loop shutting down
            log.exception("Failed to run a pass of ChatbotService %s/%s", *key)
            retry = Retry(self.settings.retry.base_delay, str(exc))
        old = self._retries.pop(key, None)
        if old is not None:
            old.cancel()
        if retry is not None:
            log.warning("%s: ChatbotService %s/%s, retry in %.0fs", retry.why, *key, retry.delay)
            self._retries[key] = asyncio.get_running_loop().call_later(retry.delay, self.trigger, key)

    def node_event(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A node appeared, changed labels or GPUs: retry at once the ChatbotServices waiting for one."""
        if self.world.changed("Node", body, deleted=event_type == "DELETED"):
            for key in list(self._waiting_for_nodes):
                self.trigger(key)

    def crd_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A CRD of an API group that changes what a pass writes appeared, changed or went (Gateway API:
        HTTPRoutes or the replica ratio; KEDA: a ScaledObject or an HPA): forget the cached discovery and
        run every ChatbotService once more, a moment later (the API serves a group once its CRD is
        Established). Without this a steady ChatbotService would keep its traffic mode until its next
        change. Not at start-up's listing (every object gets a pass then anyway)."""
        group = (body.get("spec") or {}).get("group")
        if event_type is None or group not in REDISCOVER_GROUPS:
            return
        self.releases.rediscover()
        self.autoscaling.rediscover()
        log.info(
            "API group %s changed (%s CRD %s): every ChatbotService passes again in %.0fs",
            group,
            event_type,
            body.get("metadata", {}).get("name"),
            REDISCOVER_DELAY,
        )
        # a group's CRDs come and go in bursts: one round of passes, REDISCOVER_DELAY after the last event
        if self._rediscovery is not None:
            self._rediscovery.cancel()
        self._rediscovery = asyncio.get_running_loop().call_later(REDISCOVER_DELAY, self._pass_everyone)

    def _pass_everyone(self) -> None:
        """Ask for a pass of every ChatbotService the watch knows."""
        self._rediscovery = None
        for key in self.world.owners():
            self.trigger(key)

    def _wake_held(self, but: Key) -> None:
        """A place in the upgrade wave freed, or a halt began or lifted: every fleet held for one passes again
        (a held fleet has no timer of its own), to go or to say the wave is halted."""
        for waiting in self._waiting_for_wave - {but}:
            self.trigger(waiting)

    def forget(self, key: Key) -> None:
        """Drop per-object state once a ChatbotService is deleted."""
        self._waiting_for_nodes.discard(key)
        self._waiting_for_wave.discard(key)
        if self.wave.forget(key):
            self._wake_held(but=key)
        self._locks.pop(key, None)
        self._failures.pop(key, None)
        self._generations.pop(key, None)
        for timers in (self._retries, self._due):
            timer = timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        self.world.forget(*key)
        self.autoscaling.forget(key)
