"""kopf registrations only, generated from kinds.py's table; each handler delegates to the Controller.

The Controller is created by `cli.py` (which wires the API module in) and installed with `install()`
before kopf starts, so this module never imports the Kubernetes client.

Watch caches (kopf indexes): kopf fills them all before any handler runs, so a restarted operator sees
every owned object before its first pass, and plans no spurious writes. Owned objects and pods: any
change that matters (a pod got Ready, a hand edit, a deletion) triggers the owner.

Each indexed kind's index and event handler are two plain functions, declared to kopflean.py: its lean
watcher calls them inline for every watch event, instead of kopf's per-event machinery, while kopf keeps
the watch, the index and the start-up gate. The kopf registrations delegate to the same functions (they
are what makes kopf watch the kind and keep its index). Every handler kopf runs is `async def`: kopf runs
a plain function in its thread pool, a hop per watch event (submit, a future, a wake-up of the loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from chatfleet_operator import api, garbage, kopfext, kopflean
from chatfleet_operator.cache import owner_key, slim
from chatfleet_operator.controller import Controller
from chatfleet_operator.converge.facts import node_facts, pod_facts
from chatfleet_operator.kinds import BY_NAME, KINDS, Kind, Watch
from chatfleet_operator.kopfext import NoDiffBase, decode_watch_streams_faster

MANAGED = {api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE}
OWNED = {api.LABEL_SERVICE: kopf.PRESENT}

_controller: Controller | None = None


def install(controller: Controller) -> None:
    """Install the Controller the handlers delegate to (called by cli before kopf starts)."""
    global _controller
    _controller = controller


def controller_for(kwargs: dict[str, Any]) -> Controller:
    """The installed Controller, with kopf's indexes attached."""
    assert _controller is not None, "chatfleet_operator.main.install() was not called"
    _controller.use_indexes(kwargs)
    return _controller


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Tune kopf: no log events posted (only the operator's own Warnings), no per-event diff base (no
    change handlers), long watches, short backoffs, watch events decoded by orjson, owned kinds and pods
    filtered by the API server (kopf runs start-up handlers before it starts any watcher); and the
    process's garbage collector, so decoded watch events die young (garbage.py)."""
    garbage.tune()
    decode_watch_streams_faster()
    settings.posting.enabled = False
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 600
    settings.networking.error_backoffs = (1, 2, 4, 8, 16, 30)
    for kind in KINDS:
        if kind.watch in (Watch.CHILD, Watch.POD):
            selector = label_selector(watched_labels(kind))
            settings.watching.label_selectors[kind.group, kind.version, kind.plural] = selector


def watched_labels(kind: Kind) -> dict[str, Any]:
    """The labels of what the operator watches of a kind: pods of a ChatbotService, or owned objects."""
    return OWNED if kind.watch == Watch.POD else MANAGED


def label_selector(labels: dict[str, Any]) -> str:
    """A kopf label filter as the API server's labelSelector, so a watch of pods or owned kinds carries
    only the operator's objects, not every pod of the cluster (the handlers' own filter stays).

    e.g. {"app.kubernetes.io/managed-by": "chatfleet-operator"} -> "app.kubernetes.io/managed-by=chatfleet-operator";
    {"chatfleet.io/service": kopf.PRESENT} -> "chatfleet.io/service".
    """
    return ",".join(
        key if value is kopf.PRESENT else f"{key}={value}" for key, value in sorted(labels.items())
    )


def _register_child(kind: Kind) -> None:
    """An index by owner and an event handler that triggers the owner, for one owned kind or pods."""
    labels = watched_labels(kind)
    reduce = pod_facts if kind.watch == Watch.POD else slim

    def entries(body: Mapping[str, Any]) -> dict[Any, Any] | None:
        """Index one owned object (pods: reduced to PodFacts) by its owner."""
        key = owner_of(body) if selected(labels, body) else None
        return {key: reduce(body)} if key else None

    def react(type: str | None, body: Mapping[str, Any], indexes: Mapping[str, Any]) -> None:
        """Trigger the owner when what matters about the object changed (kinds.py's change signature)."""
        if selected(labels, body):
            controller_for(indexes).child_event(kind.name, type or "", body, owner_of(body))

    _declare(kind, labels, entries, react)


def selected(labels: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether the object carries the labels (kopf's filter of the handlers; the API server's selector
    already sends only those, so this only keeps kopf's meaning where a watch has none)."""
    have = body.get("metadata", {}).get("labels") or {}
    return all(
        key in have if value is kopf.PRESENT else have.get(key) == value for key, value in labels.items()
    )


def owner_of(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, owner) of an owned object or pod, from its chatfleet.io/service label."""
    meta = body.get("metadata", {})
    return owner_key(meta.get("namespace"), meta.get("labels") or {})


def _declare(
    kind: Kind, labels: dict[str, Any] | None, entries: kopflean.Entries, react: kopflean.React
) -> None:
    """Register a watched kind's index and event handler with kopf (which then watches it and keeps the
    index) and declare them lean (kopflean.py handles its events, with these same functions)."""
    filters: dict[str, Any] = {"labels": labels} if labels else {}

    @kopf.index(kind.group, kind.version, kind.plural, id=kind.index, **filters)
    async def index(body: kopf.Body, **_: Any) -> Mapping[Any, Any] | None:
        return entries(body)

    @kopf.on.event(kind.group, kind.version, kind.plural, id=f"{kind.index}_event", **filters)
    async def event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
        react(type, body, kwargs)

    index.__doc__, event.__doc__ = entries.__doc__, react.__doc__
    kopflean.declare(kind.group, kind.plural, kopflean.Lean(kind.index, entries, react))


for _kind in KINDS:
    if _kind.watch in (Watch.CHILD, Watch.POD):
        _register_child(_kind)


def _node_entries(body: Mapping[str, Any]) -> dict[Any, Any]:
    """Index nodes, reduced to NodeFacts (GPU product, allocatable GPUs)."""
    return {"nodes": node_facts(body)}


def _node_react(type: str | None, body: Mapping[str, Any], indexes: Mapping[str, Any]) -> None:
    """Retry ChatbotServices waiting for a GPU node when nodes appear or change labels or GPUs."""
    controller_for(indexes).node_event(type or "", body)


_declare(BY_NAME["Node"], None, _node_entries, _node_react)


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions")
async def crd_event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
    """Gateway API's or KEDA's CRDs appearing or going: every ChatbotService passes again (its traffic mode
    or autoscaler changes). kopf already watches CRDs for its resource discovery (the same RBAC)."""
    controller_for(kwargs).crd_event(type, body)


@kopf.on.probe(id="watchers", errors=kopf.ErrorsMode.PERMANENT)
async def watchers_probe(**_: Any) -> float:
    """Liveness (kopf's /healthz, for the kubelet): fails once kopf's orchestrator has waited
    STOPS_FAIL_SECONDS for watchers it stopped; until they end it watches no new namespace or CRD, and
    only a restart mends that. Otherwise the seconds it has waited so far (0.0: none)."""
    held = kopfext.ORCHESTRATOR_STOPS.held_seconds()
    if held >= kopfext.STOPS_FAIL_SECONDS:
        raise kopf.PermanentError(
            f"kopf has waited {held:.0f} s for watchers it stopped to end; it watches no new namespace or CRD"
        )
    return round(held, 1)


# The ChatbotService itself.


def _cbs_entries(body: Mapping[str, Any]) -> dict[Any, Any]:
    """Index ChatbotServices by (namespace, name)."""
    meta = body.get("metadata", {})
    return {(meta.get("namespace"), meta.get("name")): slim(body)}


def _cbs_react(type: str | None, body: Mapping[str, Any], indexes: Mapping[str, Any]) -> None:
    """A pass when a ChatbotService is listed (start-up) or its spec is new; forget a deleted one.

    Event handlers only: kopf keeps no bookkeeping in the object (no annotation patches, no finalizer);
    `status.observedGeneration`, written by the pass, is the record of what was reconciled.
    """
    controller_for(indexes).cbs_event(type, body)


_declare(BY_NAME[api.KIND], None, _cbs_entries, _cbs_react)
