"""A lean watcher for the kinds whose kopf handlers only index an object and react to its events.

Every kind the operator watches with an index (its owned kinds, pods, nodes, ChatbotServices) has exactly
two handlers: an index that maps the object to its entries, and an event handler that hands the event to
the Controller (main.py). kopf 1.45.2 runs each watch event of them through its whole machinery: a worker
task and a queue per object, a per-object memory, three loggers, a throttler, a handler-selection pass,
an invocation through its executor for each of the two handlers, and a Patch. With 1,000 ChatbotServices
that machinery was about a third of the operator's CPU, the handlers' own code about 3 %
(docs/benchmarks.md, bench-operator's profile).

`watch` replaces kopf's watcher for these kinds, and keeps what the operator relies on:
- kopf's watch stream (`infinite_watch`: list, then watch, reconnects, the peering pause, the API server's
  label selector of main.py's `configure`);
- kopf's own indexes (the `OperatorIndexer` of the handler's id), so every handler kopf still runs sees
  them in its kwargs as before;
- kopf's start-up gate: the watch's gate opens once its listing is indexed, and no event of any kind is
  handed on before every gate is open (a restarted operator plans no pass on a half-filled cache); the
  listed objects' events are then handed on, in order;
- an object's events in the order they came, one at a time (inline: the handlers never wait);
- errors: one that an index raises drops the object from its index (as kopf does), one that an event
  handler raises is logged; neither stops the watch.

kopf still registers the handlers (that is what makes it watch a kind and make its index) and runs every
other handler (the CRD observer, the probes, start-up). A kind is handled here only when main.py declared
it (`declare`) and kopf's orchestrator hands the watcher kopf's own processor (it carries the indexes).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kopf._cogs.clients import watching

log = logging.getLogger("chatfleet")

#: What an index makes of one object: {index key: value}, or None (not indexed).
Entries = Callable[[Mapping[str, Any]], Mapping[Any, Any] | None]
#: What an event does: (event type: None when listed, the object, kopf's indexes by id).
React = Callable[[str | None, Mapping[str, Any], Mapping[str, Any]], None]


@dataclass(frozen=True)
class Lean:
    """The two handlers of one watched kind, as plain functions."""

    index_id: str
    entries: Entries
    react: React


_DECLARED: dict[tuple[str, str], Lean] = {}


def declare(group: str, plural: str, lean: Lean) -> None:
    """Handle the kind (group, plural) here, with these handlers (main.py, at import)."""
    _DECLARED[group, plural] = lean


def lean_for(resource: Any, processor: Any) -> Lean | None:
    """The kind's declared handlers, when kopf's processor carries the indexes they fill; else None."""
    lean = _DECLARED.get((getattr(resource, "group", None), getattr(resource, "plural", None)))
    indexers = processor.keywords.get("indexers") if isinstance(processor, functools.partial) else None
    return lean if lean is not None and indexers is not None and lean.index_id in indexers else None


def index(indexers: Any, lean: Lean, event_type: str | None, body: Mapping[str, Any]) -> None:
    """Put the object's entries in kopf's index (a deleted object, or one whose index fails: none), under
    kopf's own key of the object (`OperatorIndexers.make_key`)."""
    indexer, key = indexers[lean.index_id], indexers.make_key(body)
    if event_type == "DELETED":
        indexer.discard(key)
        return
    try:
        entries = lean.entries(body)
    except Exception:
        log.exception("Index %s failed on %s/%s; the object is left out of it", lean.index_id, *key[:2])
        indexer.discard(key)
        return
    if entries is None:
        indexer.discard(key)
    else:
        indexer.replace(key, entries)


def react(lean: Lean, event_type: str | None, body: Mapping[str, Any], indices: Mapping[str, Any]) -> None:
    """Hand one event on; an error is logged, and the watch goes on."""
    try:
        lean.react(event_type, body, indices)
    except Exception:
        meta = body.get("metadata", {})
        log.exception(
            "Handling a %s event of %s/%s failed", lean.index_id, meta.get("namespace"), meta.get("name")
        )


async def watch(
    *,
    lean: Lean,
    namespace: Any,
    settings: Any,
    resource: Any,
    processor: Any,
    operator_paused: Any = None,
    operator_indexed: Any = None,
    resource_indexed: Any = None,
) -> None:
    """Watch one kind (in one namespace, or cluster-wide) with its lean handlers, until cancelled."""
    indexers = processor.keywords["indexers"]
    indices = indexers.indices
    held: list[tuple[str | None, Mapping[str, Any]]] | None = [] if operator_indexed is not None else None
    stream = watching.infinite_watch(
        settings=settings, resource=resource, namespace=namespace, operator_paused=operator_paused
    )
    async for raw_event in stream:
        if raw_event is watching.Bookmark.LISTED:
            if held is not None:  # the first listing is indexed: open this watch's gate, wait for all
                if resource_indexed is not None:
                    await operator_indexed.drop_toggle(resource_indexed)
                await operator_indexed.wait_for(True)
                for event_type, body in held:
                    react(lean, event_type, body, indices)
                held = None
            continue
        if isinstance(raw_event, watching.Bookmark) or raw_event.get("type") == "BOOKMARK":
            continue
        event_type, body = raw_event["type"], raw_event["object"]
        index(indexers, lean, event_type, body)
        if held is None:
            react(lean, event_type, body, indices)
        else:
            held.append((event_type, body))
