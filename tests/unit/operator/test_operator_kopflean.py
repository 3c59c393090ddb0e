"""The lean watcher (kopflean.py): the kinds the operator indexes are watched without kopf's per-event
machinery, and what the operator sees is what kopf's own watcher gave it -- the same index entries, the
same events handed to the Controller, none before kopf's start-up gate opens, errors that stop nothing.

Driven through kopfext's watcher (what kopf's orchestrator starts) with kopf's own processor and indexes
built from the handlers main.py registers, the watch stream replaced by a scripted one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import kopf
from chatfleet_operator import api, kopfext, kopflean, main
from chatfleet_operator.kinds import KINDS, Watch
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import watching
from kopf._cogs.configs import configuration
from kopf._cogs.structs import references
from kopf._core.actions import lifecycles
from kopf._core.engines import indexing
from kopf._core.reactor import inventory, processing, queueing

PODS = references.Resource("", "v1", "pods", namespaced=True)


class RecordingController:
    """Stands in for the Controller: records the events the handlers hand it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def use_indexes(self, indexes: Any) -> None:
        assert "pod_index" in indexes

    def child_event(self, kind: str, event_type: str, body: Any, key: Any) -> None:
        self.calls.append((kind, event_type or "", body["metadata"]["name"], key))

    def node_event(self, event_type: str, body: Any) -> None:
        self.calls.append(("Node", event_type or "", body["metadata"]["name"]))

    def cbs_event(self, event_type: str | None, body: Any) -> None:
        self.calls.append(("ChatbotService", event_type or "", body["metadata"]["name"]))


def pod(name: str, owner: str | None, ready: bool = False, uid: str | None = None) -> dict[str, Any]:
    labels = {"chatfleet.io/service": owner} if owner else {}
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
    meta = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "labels": labels}
    return {"metadata": meta, "spec": {}, "status": status}


def event(event_type: str | None, body: dict[str, Any]) -> dict[str, Any]:
    return {"type": event_type, "object": body}


#: A pod watch: three listed (one not a ChatbotService's), then a pod gets Ready, one goes, one comes.
LISTING = [event(None, pod("a", "bot-1")), event(None, pod("b", None)), event(None, pod("c", "bot-2"))]
AFTER = [
    event("MODIFIED", pod("a", "bot-1", ready=True)),
    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
    event("DELETED", pod("c", "bot-2")),
    event("ADDED", pod("d", "bot-1")),
]


def scripted(events_after_listing: list[dict[str, Any]], listing: list[dict[str, Any]] = LISTING):
    """A watch stream: the listing, kopf's LISTED mark, the later events, then it stays open."""

    async def stream(**_: Any):
        for raw in listing:
            yield raw
        yield watching.Bookmark.LISTED
        for raw in events_after_listing:
            yield raw
        await asyncio.Event().wait()

    return stream


def kopf_processor(
    indexers: indexing.OperatorIndexers, resource: references.Resource = PODS
) -> functools.partial:
    """kopf's own processor as its runner and orchestrator build it (one partial of the other, which Python
    flattens), over the handlers main.py registered."""
    built = functools.partial(
        processing.process_resource_event,
        lifecycle=lifecycles.all_at_once,
        registry=kopf.get_default_registry(),
        settings=configuration.OperatorSettings(),
        indexers=indexers,
        memories=inventory.ResourceMemories(),
        memobase=kopf.Memo(),
        event_queue=asyncio.Queue(),
    )
    return functools.partial(built, resource=resource)


def index_contents(indexers: indexing.OperatorIndexers, index_id: str) -> dict[Any, list[Any]]:
    index = indexers.indices[index_id]
    return {key: list(index[key]) for key in index}


async def watch(
    watcher: Any,
    stream: Any,
    resource: references.Resource = PODS,
    *,
    other_gate_open_after: float | None = 0.0,
    seconds: float = 0.3,
) -> tuple[indexing.OperatorIndexers, RecordingController, list[tuple[Any, ...]]]:
    """Run `watcher` over `stream` for `seconds`, with kopf's indexes and start-up gate (one more gate,
    another kind's, opened `other_gate_open_after` seconds in; None: never). Returns the indexes, the
    controller, and what it had been handed just before that other gate opened."""
    controller = RecordingController()
    main.install(controller)  # type: ignore[arg-type]
    indexers = indexing.OperatorIndexers()
    indexers.ensure(kopf.get_default_registry()._indexing.get_all_handlers())
    indexed = aiotoggles.ToggleSet(all)
    gate = await indexed.make_toggle(name="pods@ns")
    other = await indexed.make_toggle(name="deployments@ns")
    settings = configuration.OperatorSettings()
    settings.queueing.exit_timeout = 0.1
    original, watching.infinite_watch = watching.infinite_watch, stream
    before_open: list[tuple[Any, ...]] = []
    try:
        task = asyncio.create_task(
            watcher(
                namespace="ns",
                settings=settings,
                resource=resource,
                processor=kopf_processor(indexers, resource),
                operator_indexed=indexed,
                resource_indexed=gate,
            )
        )
        if other_gate_open_after is not None:
            await asyncio.sleep(other_gate_open_after)
            before_open = list(controller.calls)
            await other.turn_to(True)
            await asyncio.sleep(seconds)
        else:
            await asyncio.sleep(seconds)
            before_open = list(controller.calls)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        watching.infinite_watch = original
        main.install(None)  # type: ignore[arg-type]
    return indexers, controller, before_open


def by_object(calls: list[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    """Each object's events in order (kopf's watcher orders an object's events, not different objects')."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for call in calls:
        out.setdefault(call[2], []).append(call)
    return out


def test_every_indexed_kind_is_declared_lean_under_its_kopf_index():
    """Each kind main.py indexes (owned kinds, pods, nodes, ChatbotServices) has its handlers declared to
    kopflean, under the id of the index kopf keeps for it."""
    ids = {h.id for h in kopf.get_default_registry()._indexing.get_all_handlers()}
    watched = [k for k in KINDS if k.watch != Watch.NONE]
    for kind in watched:
        lean = kopflean._DECLARED.get((kind.group, kind.plural))
        assert lean is not None and lean.index_id == kind.index and kind.index in ids, kind.name
    assert len(kopflean._DECLARED) == len(watched)


def test_kopfs_orchestrator_gets_the_lean_watcher_only_for_declared_kinds_with_kopfs_indexes():
    indexers = indexing.OperatorIndexers()
    indexers.ensure(kopf.get_default_registry()._indexing.get_all_handlers())
    processor = kopf_processor(indexers)
    lean = kopfext._watcher_of({"resource": PODS, "processor": processor})
    assert isinstance(lean, functools.partial) and lean.func is kopflean.watch
    crds = references.Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    assert kopfext._watcher_of({"resource": crds, "processor": processor}) is kopfext._KOPF_WATCHER
    # a processor without kopf's indexes (peering, tests): kopf's watcher
    assert kopfext._watcher_of({"resource": PODS, "processor": lambda **_: None}) is kopfext._KOPF_WATCHER


def test_the_same_indexes_and_events_as_kopfs_own_watcher():
    """The same stream through kopf's watcher and processor, and through the lean one: the pod index ends
    the same (b has no owner, c went, a is Ready, d came), and the Controller is handed the same events,
    each object's in the same order."""
    kopf_indexers, kopf_seen, _ = asyncio.run(watch(queueing.watcher, scripted(AFTER)))
    lean_indexers, lean_seen, _ = asyncio.run(watch(kopfext.watcher_that_releases_its_gates, scripted(AFTER)))
    assert index_contents(lean_indexers, "pod_index") == index_contents(kopf_indexers, "pod_index")
    pods = index_contents(lean_indexers, "pod_index")
    assert sorted(pods) == [("ns", "bot-1")]
    assert sorted((p.name, p.ready) for p in pods["ns", "bot-1"]) == [("a", True), ("d", False)]
    assert by_object(lean_seen.calls) == by_object(kopf_seen.calls)
    assert by_object(lean_seen.calls)["c"] == [
        ("Pod", "", "c", ("ns", "bot-2")),
        ("Pod", "DELETED", "c", ("ns", "bot-2")),
    ]


def test_nothing_is_handed_on_before_every_gate_is_open_then_the_listing_in_order():
    """Another kind has not listed yet: the pods are indexed, but no event reaches the Controller (a pass
    then would plan on half a cache); once that gate opens, the listed ones, in order, then the rest."""
    _, seen, before_open = asyncio.run(
        watch(kopfext.watcher_that_releases_its_gates, scripted(AFTER), other_gate_open_after=0.2)
    )
    assert before_open == []
    names = [call[2] for call in seen.calls]
    assert names == ["a", "c", "a", "c", "d"]  # b is no ChatbotService's pod


def test_a_gate_that_never_opens_hands_nothing_on():
    indexers, seen, _ = asyncio.run(
        watch(kopfext.watcher_that_releases_its_gates, scripted(AFTER), other_gate_open_after=None)
    )
    assert seen.calls == []
    assert sorted(index_contents(indexers, "pod_index")) == [("ns", "bot-1"), ("ns", "bot-2")]


def test_a_failing_index_leaves_the_object_out_and_a_failing_handler_stops_nothing(monkeypatch, caplog):
    """An index that raises drops the object from its index (kopf does so too), a handler that raises is
    logged; the watch goes on with the next events."""
    lean = kopflean._DECLARED["", "pods"]

    def entries(body):
        if body["metadata"]["name"] == "a":
            raise ValueError("no entries for a")
        return lean.entries(body)

    def react(event_type, body, indexes):
        if body["metadata"]["name"] == "c":
            raise RuntimeError("the handler failed on c")
        lean.react(event_type, body, indexes)

    monkeypatch.setitem(kopflean._DECLARED, ("", "pods"), kopflean.Lean(lean.index_id, entries, react))
    with caplog.at_level(logging.ERROR, logger="chatfleet"):
        indexers, seen, _ = asyncio.run(watch(kopfext.watcher_that_releases_its_gates, scripted(AFTER)))
    assert sorted(p.name for p in index_contents(indexers, "pod_index")["ns", "bot-1"]) == ["d"]
    assert [call[2] for call in seen.calls] == ["a", "a", "d"]  # c's two events failed, logged
    assert "no entries for a" in caplog.text and "the handler failed on c" in caplog.text


def test_a_chatbotservice_reaches_its_handler_and_its_index():
    cbs = {"metadata": {"name": "bot-1", "namespace": "ns", "uid": "u", "generation": 1}, "spec": {}}
    resource = references.Resource(api.GROUP, api.VERSION, api.PLURAL, namespaced=True)
    indexers, seen, _ = asyncio.run(
        watch(kopfext.watcher_that_releases_its_gates, scripted([], [event(None, cbs)]), resource)
    )
    assert seen.calls == [("ChatbotService", "", "bot-1")]
    assert list(index_contents(indexers, "cbs_index")) == [("ns", "bot-1")]


def test_nothing_in_the_operator_posts_through_kopf():
    """kopf's processor sets its event-posting context per event, the lean path does not: the operator
    posts its Events itself (kube.post_event), and a kopf posting call added later fails here."""
    import pathlib

    for path in pathlib.Path(main.__file__).parent.rglob("*.py"):
        text = path.read_text()
        for call in ("kopf.event(", "kopf.info(", "kopf.warn(", "kopf.exception("):
            assert call not in text, (
                f"{path.name} posts through kopf ({call}); the lean path sets no context for it"
            )
