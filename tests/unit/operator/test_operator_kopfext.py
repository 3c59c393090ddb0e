"""kopf tuning: no change handlers hence no diff base; the start-up gate: a watcher that stops releases its
gates; a watched kind whose CRD is deleted does not stop the operator."""

from __future__ import annotations

import kopf


async def run_watcher(
    patched: bool,
    api,
    processor,
    *,
    resource: tuple[str, str, str],
    seconds: float,
    exit_timeout: float = 0.1,
    stop_within: float = 10.0,
):
    """kopf's own watcher (or, `patched`, the operator's wrapper of it) over one namespaced kind in
    namespace "ns", its watch streams replaced by `api`, run for `seconds`, then cancelled as kopf's
    orchestrator cancels a watcher whose kind or namespace is gone. kopf's watcher gives its object
    workers `exit_timeout` seconds to finish when it ends.

    Returns (what the task ended with: None when cancelled; whether it still ran when cancelled; whether
    kopf's "all indexed" gates were all open just before it was cancelled, and afterwards). Fails when the
    task has not ended `stop_within` seconds after its cancellation: kopf's orchestrator waits for it
    for good, and takes in no CRD or namespace change meanwhile.
    """
    import asyncio

    from chatfleet_operator import kopfext
    from kopf._cogs.aiokits import aiotoggles
    from kopf._cogs.clients import watching
    from kopf._cogs.configs import configuration
    from kopf._cogs.structs import references
    from kopf._core.reactor import queueing

    settings = configuration.OperatorSettings()
    settings.queueing.exit_timeout = exit_timeout
    indexed = aiotoggles.ToggleSet(all)
    gate = await indexed.make_toggle(name=f"{resource[2]}@ns")
    watcher = kopfext.watcher_that_releases_its_gates if patched else queueing.watcher
    original = watching.infinite_watch
    watching.infinite_watch = api
    try:
        task = asyncio.create_task(
            watcher(
                namespace="ns",
                settings=settings,
                resource=references.Resource(*resource, namespaced=True),
                processor=processor,
                operator_indexed=indexed,
                resource_indexed=gate,
            )
        )
        await asyncio.sleep(seconds)
        running, opened_while_running = not task.done(), indexed.is_on()
        task.cancel()
        stopped, _ = await asyncio.wait({task}, timeout=stop_within)
        for _ in range(10):  # clean up a watcher that lived on (each try may be swallowed again)
            if task.done():
                break
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        assert stopped, f"the watcher still ran {stop_within:.0f} s after it was cancelled"
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
    finally:
        watching.infinite_watch = original
    outcome = None if isinstance(outcome, asyncio.CancelledError) else outcome
    return outcome, running, opened_while_running, indexed.is_on()


#: A namespaced kind whose CRD a test deletes.
TRAEFIK = ("traefik.io", "v1alpha1", "traefikservices")


def listed_then_gone(calls: list[str], pause: float = 0.0):
    """A kind's watch streams (for `run_watcher`), each call noted in `calls`: the first lists one object,
    then, `pause` seconds later, it and every later one answer 404 (the kind's CRD deleted)."""
    import asyncio

    from kopf._cogs.clients import errors, watching

    async def api(**_):
        calls.append("watch")
        if len(calls) == 1:
            yield {"type": None, "object": {"metadata": {"uid": "u1", "name": "a", "namespace": "ns"}}}
            yield watching.Bookmark.LISTED
            await asyncio.sleep(pause)
        raise errors.APINotFoundError("404 page not found", status=404, headers={})

    return api


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

        async def listing_that_never_ends(**_):
            yield {"type": None, "object": {"metadata": {"uid": "u1", "name": "a", "namespace": "ns"}}}
            await asyncio.Event().wait()  # the namespace is deleted before the listing ends

        async def processor_not_reached(**_):
            await asyncio.Event().wait()  # the object's worker never got to index it

        # cancelled: what kopf's orchestrator does when the namespace is gone
        *_, opened = await run_watcher(
            patched, listing_that_never_ends, processor_not_reached, resource=("", "v1", "pods"), seconds=0.2
        )
        return opened

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


class TestAWatchedKindDeletedDoesNotStopTheOperator:
    """A CustomResourceDefinition the operator watches is deleted (a gateway's CRDs uninstalled): the API
    server ends the kind's watches, kopf's watcher reconnects at once and, if its CRD observer has not yet
    stopped it, gets a 404. kopf 1.45.2 lets that end the whole operator (seen on the local platform:
    `Multidimensional multitasker has failed: 404 page not found` after Traefik's CRDs were removed, and
    every fleet left unreconciled). Driven here through kopf's own watcher, with the API's answers
    replaced: first a 404 (the request before any listing), then a listing of one object."""

    @staticmethod
    async def _watch(patched: bool, monkeypatch) -> tuple[BaseException | None, bool, list[str], bool]:
        import asyncio

        from chatfleet_operator import kopfext
        from kopf._cogs.clients import errors, watching

        calls: list[str] = []

        async def api(**_):
            calls.append("watch")
            if len(calls) == 1:
                raise errors.APINotFoundError("404 page not found", status=404, headers={})
            yield {"type": None, "object": {"metadata": {"uid": "u1", "name": "a", "namespace": "ns"}}}
            yield watching.Bookmark.LISTED
            await asyncio.Event().wait()  # the stream stays open

        async def processor(**_):
            pass

        monkeypatch.setattr(kopfext, "GONE_RETRY_SECONDS", (0.05,), raising=False)
        # cancelled at the end: what kopf's orchestrator does when the kind is gone for good
        outcome, running, _, opened = await run_watcher(
            patched, api, processor, resource=("traefik.io", "v1alpha1", "traefikservices"), seconds=0.5
        )
        return outcome, running, calls, opened

    def test_kopf_alone_ends_on_the_404(self, monkeypatch) -> None:
        import asyncio

        from kopf._cogs.clients import errors

        outcome, running, calls, _ = asyncio.run(self._watch(False, monkeypatch))
        assert isinstance(outcome, errors.APINotFoundError) and not running and calls == ["watch"]

    def test_the_watcher_waits_and_watches_again(self, monkeypatch) -> None:
        import asyncio

        outcome, running, calls, opened = asyncio.run(self._watch(True, monkeypatch))
        assert outcome is None and running, outcome
        assert calls == ["watch", "watch"]  # watched again once the kind was served
        assert opened  # the kind holds no start-up gate shut

    def test_objects_listed_before_the_kind_went_hold_no_gate_while_it_is_watched_again(self, monkeypatch):
        """The kind was listed while the operator's gate was shut (its CRD had just been installed, so
        every namespace's new watcher held the gate), one listed object's worker had not indexed it yet,
        then the CRD was deleted: the watch ends with a 404, kopf's watcher closes that worker, and the
        kind stays gone while kopf, its discovery not yet updated, keeps the watcher (it 404s again every
        GONE_RETRY_SECONDS). The object's gate must not stay shut meanwhile: it held every handler of
        every kind (the integration suite's operator reconciled nothing for minutes after a Traefik
        module uninstalled its CRDs, its log only these 404 warnings)."""
        import asyncio

        from chatfleet_operator import kopfext

        calls: list[str] = []

        async def processor_not_reached(**_):
            await asyncio.Event().wait()  # the object's worker never got to index it

        monkeypatch.setattr(kopfext, "GONE_RETRY_SECONDS", (0.05,), raising=False)
        outcome, running, opened_while_running, _ = asyncio.run(
            run_watcher(
                True, listed_then_gone(calls, 0.05), processor_not_reached, resource=TRAEFIK, seconds=0.6
            )
        )
        assert outcome is None and running, outcome
        assert len(calls) >= 3  # listed, then watched again and again while the kind is gone
        assert opened_while_running

    def test_a_watcher_cancelled_while_it_closes_its_workers_after_a_404_stops(self, monkeypatch):
        """The kind's CRD is deleted: its watch ends with a 404 while one listed object's worker is busy,
        and kopf's orchestrator, its discovery updated, cancels the watcher while kopf's watcher waits for
        that worker. kopf's watcher swallows a cancellation that lands then and raises the 404 instead:
        watched again, the watcher never ended, and the orchestrator waited for it for good, holding its
        insights, so namespaces created afterwards were never watched (seen in CI: the integration
        suite's operator reconciled no new ChatbotService for minutes, its log only these 404 warnings)."""
        import asyncio

        from chatfleet_operator import kopfext

        calls: list[str] = []

        async def processor_busy(**_):
            await asyncio.Event().wait()  # the object's worker is still at work when the watch ends

        monkeypatch.setattr(kopfext, "GONE_RETRY_SECONDS", (0.05,), raising=False)
        # cancelled 0.3 s in: kopf's watcher is then waiting (up to 2 s) for the busy worker
        outcome, running, _, _ = asyncio.run(
            run_watcher(
                True,
                listed_then_gone(calls),
                processor_busy,
                resource=TRAEFIK,
                seconds=0.3,
                exit_timeout=2.0,
                stop_within=5.0,
            )
        )
        assert outcome is None and running, outcome
        assert calls == ["watch"]  # not watched again once cancelled


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


def test_every_watch_handler_runs_on_the_event_loop():
    """Indexes and event handlers are coroutines: kopf runs a plain function in its thread pool, a hop
    per watch event (submit, a future, a wake-up of the loop) -- a plain `def` handler fails here."""
    import inspect

    from chatfleet_operator import main  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()
    handlers = [*registry._indexing.get_all_handlers(), *registry._watching.get_all_handlers()]
    assert len(handlers) >= 20, [h.id for h in handlers]
    plain = [h.id for h in handlers if not inspect.iscoroutinefunction(h.fn)]
    assert plain == []


def test_the_start_up_gate_wakes_its_waiters_only_when_it_opens():
    """kopf's ToggleSet wakes every waiter on every added or dropped gate: at start-up each listed object
    has a gate and a worker that, once it indexed the object, drops the gate and waits for the whole set,
    so N objects cost N^2 wake-ups (a restarted operator over 3,000 ChatbotServices spent minutes of a
    core in them). Through the watcher's view of the set (`_GatesMadeBy`), the waiters wake when the set
    opens, not on each gate. Counted: how often the set's state is computed (each wake-up computes it)."""
    import asyncio

    from chatfleet_operator.kopfext import _GatesMadeBy
    from kopf._cogs.aiokits import aiotoggles

    async def scenario(view_of) -> tuple[int, bool]:
        indexed = aiotoggles.ToggleSet(all)
        computed = 0

        def counting_all(states):
            nonlocal computed
            computed += 1
            return all(states)

        indexed._fn = counting_all
        view = view_of(indexed)
        n = 200
        gates = [await view.make_toggle(name=f"object-{i}") for i in range(n)]
        waiters = [asyncio.create_task(view.wait_for(True)) for _ in range(n)]
        await asyncio.sleep(0)
        for gate in gates:  # each worker drops its gate once it indexed its object
            await view.drop_toggle(gate)
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
        return computed, indexed.is_on()

    quiet, opened = asyncio.run(scenario(_GatesMadeBy))
    loud, _ = asyncio.run(scenario(lambda s: s))  # kopf's own set, as before
    assert opened
    assert quiet < 10 * 200, quiet  # a few state checks per gate and per waiter: linear
    assert loud > 50 * 200, loud  # kopf's: every waiter on every drop: quadratic


class TestTheGateWatch:
    """kopf runs no handler while one start-up gate is shut: the operator samples how long, and by which
    gates (the metric chatfleet_operator_handlers_held_seconds and a warning that names them); before it,
    an operator held for good logged nothing about why."""

    def test_held_seconds_count_from_the_first_sample_that_found_a_gate_shut(self) -> None:
        from chatfleet_operator.kopfext import GateWatch

        gates: list[str] = []
        watch = GateWatch(lambda: list(gates))
        assert watch.sample(100.0) == 0.0 and watch.held_seconds(105.0) == 0.0
        gates.append("traefikservices.v1alpha1.traefik.io@t-1")
        assert watch.sample(110.0) == 0.0
        assert watch.sample(140.0) == 30.0 and watch.held_seconds(150.0) == 40.0
        assert watch.names == ["traefikservices.v1alpha1.traefik.io@t-1"]
        gates.clear()
        assert watch.sample(160.0) == 0.0 and watch.held_seconds(170.0) == 0.0

    def test_shut_gates_names_the_gates_kopfs_set_holds_shut(self) -> None:
        import asyncio

        from chatfleet_operator import kopfext
        from kopf._cogs.aiokits import aiotoggles

        async def scenario() -> tuple[list[str], list[str]]:
            indexed = aiotoggles.ToggleSet(all)
            gates = kopfext._GatesMadeBy(indexed)  # what each watcher kopf starts is given
            shut = await gates.make_toggle(name="pods.v1@t-1")
            await gates.make_toggle(True, name="deployments.v1.apps@t-1")
            before = kopfext.shut_gates()
            await gates.drop_toggle(shut)
            return before, kopfext.shut_gates()

        assert asyncio.run(scenario()) == (["pods.v1@t-1"], [])

    def test_a_gate_held_past_the_limit_is_warned_with_its_names(self, caplog) -> None:
        import asyncio
        import logging

        from chatfleet_operator.kopfext import GateWatch

        async def scenario() -> None:
            watch = GateWatch(lambda: [f"kind@ns-{i}" for i in range(7)])
            task = asyncio.create_task(watch.run(period=0.01, warn_after=0.0))
            await asyncio.sleep(0.05)
            task.cancel()

        with caplog.at_level(logging.WARNING, logger="chatfleet"):
            asyncio.run(scenario())
        warnings = [r.getMessage() for r in caplog.records if "start-up gate" in r.getMessage()]
        assert warnings and "kind@ns-0, kind@ns-1" in warnings[0] and "and 2 more" in warnings[0]

    def test_an_open_gate_warns_nothing(self, caplog) -> None:
        import asyncio
        import logging

        from chatfleet_operator.kopfext import GateWatch

        async def scenario() -> None:
            task = asyncio.create_task(GateWatch(lambda: []).run(period=0.01, warn_after=0.0))
            await asyncio.sleep(0.05)
            task.cancel()

        with caplog.at_level(logging.WARNING, logger="chatfleet"):
            asyncio.run(scenario())
        assert not [r for r in caplog.records if "start-up gate" in r.getMessage()]


def read_kopfs_watch_stream(lines: list[bytes], monkeypatch) -> tuple[list, int]:
    """kopf's own watch stream (`kopf._cogs.clients.api.stream`) over a response that sends `lines`, split
    across chunks mid-line; returns the events it yields and how many times orjson decoded one."""
    import asyncio
    import logging

    import orjson
    from chatfleet_operator import kopfext
    from kopf._cogs.clients import api
    from kopf._cogs.configs import configuration

    payload = b"\n".join(lines) + b"\n"

    class Content:
        async def iter_chunked(self, size: int):
            for start in range(0, len(payload), 7):
                yield payload[start : start + 7]

    class Response:
        content = Content()

        async def __aenter__(self):
            return self

        async def __aexit__(self, *_):
            return None

        def close(self) -> None:
            pass

    async def request(**_):
        return Response()

    decoded = []

    def counting(text):
        decoded.append(text)
        return orjson_loads(text)

    orjson_loads = orjson.loads
    monkeypatch.setattr(api, "request", request)
    monkeypatch.setattr(kopfext.orjson, "loads", counting)

    async def read() -> list:
        settings = configuration.OperatorSettings()
        return [e async for e in api.stream("/apis/x", settings=settings, logger=logging.getLogger("t"))]

    return asyncio.run(read()), len(decoded)


class TestWatchStreamsDecodedByOrjson:
    """Decoding watch events was 37 % of the operator's CPU with 1,000 ChatbotServices (Python's `json`
    in kopf's stream); orjson reads the same objects in about half the time."""

    EVENTS = [
        {"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "bot-0", "labels": {"a": "é"}}}},
        {"type": "MODIFIED", "object": {"kind": "Deployment", "status": {"replicas": 2, "ready": 1.5}}},
    ]

    def lines(self) -> list[bytes]:
        import json

        return [json.dumps(event, ensure_ascii=False).encode() for event in self.EVENTS]

    def test_kopf_alone_decodes_with_pythons_json(self, monkeypatch) -> None:
        import json

        from kopf._cogs.clients import api

        monkeypatch.setattr(api, "json", json)
        events, by_orjson = read_kopfs_watch_stream(self.lines(), monkeypatch)
        assert events == self.EVENTS
        assert by_orjson == 0

    def test_the_operators_start_up_makes_kopf_decode_each_event_with_orjson(self, monkeypatch) -> None:
        import json

        from chatfleet_operator import main
        from kopf._cogs.clients import api

        monkeypatch.setattr(api, "json", json)
        main.configure(settings=kopf.OperatorSettings())
        events, by_orjson = read_kopfs_watch_stream(self.lines(), monkeypatch)
        assert events == self.EVENTS
        assert by_orjson == len(self.EVENTS)

    def test_what_orjson_refuses_is_read_as_pythons_json_reads_it(self) -> None:
        import json

        import pytest
        from chatfleet_operator.kopfext import decode

        for text in (
            '{"n": [9223372036854775807, -9223372036854775808]}',
            '{"x": NaN}',
            b'{"a": [1, "\xc3\xa9"]}',
        ):
            assert repr(decode(text)) == repr(json.loads(text))
        with pytest.raises(json.JSONDecodeError):
            decode('{"a": ')


def test_the_api_server_sends_only_the_operators_pods_and_owned_objects():
    """kopf's label filters on handlers are applied in the operator, after every pod of the cluster was
    sent and decoded; the start-up settings ask the API server to filter the watches of pods and owned
    kinds by the same labels -- and nothing else's (ChatbotServices, nodes, CRDs: every one is read)."""
    from chatfleet_operator import main
    from kopf._cogs.structs.references import Resource

    settings = kopf.OperatorSettings()
    main.configure(settings=settings)

    def selectors(group: str, version: str, plural: str) -> list[str]:
        return settings.watching.label_selectors.collect(Resource(group, version, plural))

    assert selectors("", "v1", "pods") == ["chatfleet.io/service"]
    assert selectors("apps", "v1", "deployments") == ["app.kubernetes.io/managed-by=chatfleet-operator"]
    assert selectors("", "v1", "services") == ["app.kubernetes.io/managed-by=chatfleet-operator"]
    assert selectors("policy", "v1", "poddisruptionbudgets") == [
        "app.kubernetes.io/managed-by=chatfleet-operator"
    ]
    assert selectors("", "v1", "nodes") == []
    assert selectors("chatfleet.io", "v1alpha1", "chatbotservices") == []
    assert selectors("apiextensions.k8s.io", "v1", "customresourcedefinitions") == []
