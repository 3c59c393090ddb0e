"""kopf tuning: no change handlers hence no diff base; the start-up gate: a watcher that stops releases its gates."""

from __future__ import annotations

import kopf


class TestIndexReadinessSurvivesStoppedWatchers:
    """A watcher stopped before its listing ends must not hold kopf's "all indexed" gate shut forever.

    kopf blocks every handler until each (resource, namespace) watcher has listed and each listed
    object was indexed once. When a watched namespace disappears while the operator starts (a
    namespace being deleted), kopf stops its watchers but leaves their gates in place: the operator
    then never runs a handler again. Seen as a restarted operator that reconciled nothing (the
    integration suite's restart test, with the namespaces of earlier tests still terminating).
    """

    @staticmethod
    async def _stopped_mid_listing(patched: bool) -> bool:
        import asyncio

        from chatfleet_operator import kopfext
        from kopf._cogs.aiokits import aiotoggles
        from kopf._cogs.clients import watching
        from kopf._cogs.configs import configuration
        from kopf._cogs.structs import references
        from kopf._core.reactor import queueing

        async def listing_that_never_ends(**_):
            yield {"type": None, "object": {"metadata": {"uid": "u1", "name": "a", "namespace": "gone"}}}
            await asyncio.Event().wait()  # the namespace is deleted before the listing ends

        async def processor_not_reached(**_):
            await asyncio.Event().wait()  # the object's worker never got to index it

        settings = configuration.OperatorSettings()
        settings.queueing.exit_timeout = 0.1
        resource = references.Resource("", "v1", "pods", namespaced=True)
        indexed = aiotoggles.ToggleSet(all)
        gate = await indexed.make_toggle(name="pods@gone")
        watcher = kopfext.watcher_that_releases_its_gates if patched else queueing.watcher
        original = watching.infinite_watch
        watching.infinite_watch = listing_that_never_ends
        try:
            task = asyncio.create_task(
                watcher(
                    namespace="gone",
                    settings=settings,
                    resource=resource,
                    processor=processor_not_reached,
                    operator_indexed=indexed,
                    resource_indexed=gate,
                )
            )
            await asyncio.sleep(0.2)
            task.cancel()  # what kopf's orchestrator does when the namespace is gone
            await asyncio.gather(task, return_exceptions=True)
        finally:
            watching.infinite_watch = original
        return indexed.is_on()

    def test_kopf_alone_keeps_the_gate_shut(self) -> None:
        import asyncio

        assert asyncio.run(self._stopped_mid_listing(patched=False)) is False

    def test_the_patched_watcher_releases_its_gates(self) -> None:
        import asyncio

        assert asyncio.run(self._stopped_mid_listing(patched=True)) is True

    def test_repair_is_what_kopf_orchestrator_starts(self) -> None:
        from chatfleet_operator import kopfext
        from kopf._core.reactor import orchestration, queueing

        original = queueing.watcher
        try:
            kopfext.repair_index_gates()
            assert orchestration.queueing.watcher is kopfext.watcher_that_releases_its_gates
        finally:
            queueing.watcher = original


def test_no_change_handlers_so_no_diff_base_is_needed():
    """kopf's diff base (a deep copy of every event's body) is dropped (NoDiffBase): only change handlers
    read it, and the operator registers none -- a change handler added later fails here."""
    from chatfleet_operator import main
    from chatfleet_operator.kopfext import NoDiffBase

    registry = kopf.get_default_registry()
    assert list(registry._changing.get_all_handlers()) == []
    assert NoDiffBase().build(body=kopf.Body({"metadata": {"name": "a"}, "spec": {}})) is None
    settings = kopf.OperatorSettings()
    main.configure(settings=settings)
    assert isinstance(settings.persistence.diffbase_storage, NoDiffBase)
