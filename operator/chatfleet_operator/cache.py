"""The read-your-writes cache: kopf's watch caches (indexes) plus the objects this process just wrote.

A pass reads the freshest view of one ChatbotService and its children: what the watches delivered, or
what our own last write returned when its watch event has not arrived yet (so a pass never recomputes a
status from a stale cache, and never writes an object twice).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.converge.diagnose import NodeCatalog
from chatfleet_operator.converge.facts import QUIET_POD, PodFacts
from chatfleet_operator.kinds import BY_NAME, CHILDREN, change_signature

Key = tuple[str, str]  # (namespace, ChatbotService name)


def child_names(owner: str) -> tuple[str, ...]:
    """Names our writes to an owner's children may carry (the remembered writes looked up per pass)."""
    return (owner, f"{owner}-{api.TRACK_CANARY}", f"{owner}-{api.TRACK_PREVIEW}")


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """Keep what comparison and facts need from a watched object (drops managedFields to save memory)."""
    meta = dict(body.get("metadata", {}))
    meta.pop("managedFields", None)
    out = {k: v for k, v in body.items() if k not in ("metadata",)}
    out["metadata"] = meta
    return dict(out)


def owner_key(namespace: str | None, labels: Mapping[str, str]) -> Key | None:
    """(namespace, owner) of an owned object from its chatfleet.io/service label."""
    owner = labels.get(api.LABEL_SERVICE)
    return (namespace, owner) if namespace and owner else None


def resource_version(body: Mapping[str, Any]) -> int:
    """resourceVersion as an int for ordering (opaque by contract, numeric with etcd)."""
    value = str(body.get("metadata", {}).get("resourceVersion", "0"))
    return int(value) if value.isdigit() else 0


@dataclass
class Snapshot:
    """What one pass observes: owned objects by (kind, name), pods, nodes. Taken on the event loop."""

    children: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    pods: list[PodFacts] = field(default_factory=list)
    nodes: NodeCatalog = field(default_factory=NodeCatalog)


class World:
    """The watch caches (kopf indexes) plus the objects this process has just written."""

    def __init__(self) -> None:
        self.indexes: Mapping[str, Any] = {}
        self._recent: dict[tuple[str, str, str], tuple[int, Mapping[str, Any] | None]] = {}
        self._signatures: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._status_written: dict[Key, datetime] = {}
        self._status_held: dict[Key, datetime] = {}
        self._nodes: NodeCatalog | None = None  # None: a node's facts changed since it was built
        self._lock = threading.Lock()

    def changed(self, kind: str, body: Mapping[str, Any], deleted: bool = False) -> bool:
        """Record an object's change signature; True when it differs from the last one seen or written."""
        return self.observe(kind, body, deleted) is not None

    def observe(
        self, kind: str, body: Mapping[str, Any], deleted: bool = False
    ) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None] | None:
        """Record an object's change signature: (the one before, the new one) when they differ, None when
        they do not (the new one is None for a deletion that matters)."""
        meta = body.get("metadata", {})
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            if deleted:
                before = self._signatures.pop(key, None)
                matters = kind != "Pod" or (before is not None and before != QUIET_POD)
                change = (before, None) if matters else None
            else:
                signature = change_signature(kind, body)
                before = self._signatures.get(key, QUIET_POD if kind == "Pod" else None)
                self._signatures[key] = signature
                change = (before, signature) if signature != before else None
            if change is not None and kind == "Node":
                self._nodes = None  # the watch cache holds the node's new facts: a new catalog
        return change

    def remember(self, kind: str, namespace: str, name: str, body: Mapping[str, Any] | None, rv: int) -> None:
        """Record an object we wrote (or a tombstone), newer than the watch cache until its event arrives."""
        with self._lock:
            self._recent[(kind, namespace, name)] = (rv, body)

    def wrote(self, kind: str, namespace: str, name: str, rv: int) -> bool:
        """Whether this process's last write of that object returned it at resourceVersion `rv` (and the
        watch cache had not caught up with it by the object's last snapshot)."""
        with self._lock:
            entry = self._recent.get((kind, namespace, name))
        return entry is not None and entry[1] is not None and entry[0] == rv

    def status_written(self, key: Key, at: datetime) -> None:
        """Record when this process last wrote a ChatbotService's status (a write ends any hold)."""
        with self._lock:
            self._status_written[key] = at
            self._status_held.pop(key, None)

    def status_written_at(self, key: Key) -> datetime | None:
        """When this process last wrote the status (None: not since it started)."""
        with self._lock:
            return self._status_written.get(key)

    def hold_status(self, key: Key, until: datetime) -> None:
        """Record that a pass held a ChatbotService's status write back until `until`."""
        with self._lock:
            self._status_held[key] = until

    def status_held_until(self, key: Key) -> datetime | None:
        """Until when the last pass held the status write back (None: it did not, or it was written since)."""
        with self._lock:
            return self._status_held.get(key)

    def owners(self) -> list[Key]:
        """Every ChatbotService the watch knows, as (namespace, name)."""
        idx = self.indexes.get(BY_NAME[api.KIND].index)
        return sorted(idx) if idx is not None else []

    def forget(self, namespace: str, owner: str) -> None:
        """Drop remembered writes of one owner (when it is deleted)."""
        names = child_names(owner)
        with self._lock:
            self._status_written.pop((namespace, owner), None)
            self._status_held.pop((namespace, owner), None)
            for kind in (*(k.name for k in CHILDREN), api.KIND):
                for name in names:
                    self._recent.pop((kind, namespace, name), None)

    def _store(self, index: str, key: Any) -> list[Any]:
        """Values of one index key (empty when unknown)."""
        idx = self.indexes.get(index)
        if idx is None or key not in idx:
            return []
        return list(idx[key])

    def body(self, key: Key, given: Mapping[str, Any] | None = None) -> Mapping[str, Any] | None:
        """The freshest ChatbotService body: the watch cache, the handler's, or our last status write."""
        values = self._store(BY_NAME[api.KIND].index, key)
        candidates = [b for b in (values[0] if values else None, given) if b is not None]
        if not candidates:
            return None  # deleted (or never seen)
        with self._lock:
            _, written = self._recent.get((api.KIND, *key), (0, None))
        if written is not None:
            candidates.append(written)
        return max(candidates, key=resource_version)

    def snapshot(self, key: Key) -> Snapshot:
        """Copy what a pass needs out of the indexes (call on the event loop thread)."""
        snap = Snapshot()
        for child in CHILDREN:
            for body in self._store(child.index, key):
                snap.children[(child.name, body["metadata"]["name"])] = body
        namespace, owner = key
        candidates = child_names(owner)
        with self._lock:
            for kind in (k.name for k in CHILDREN):
                for name in candidates:
                    entry = self._recent.get((kind, namespace, name))
                    if entry is None:
                        continue
                    rv, written = entry
                    current = snap.children.get((kind, name))
                    if written is None:  # a tombstone: hide the deleted object until the cache drops it
                        if current is not None and resource_version(current) <= rv:
                            del snap.children[(kind, name)]
                        else:
                            del self._recent[(kind, namespace, name)]
                    elif current is not None and resource_version(current) >= rv:
                        del self._recent[(kind, namespace, name)]  # the cache caught up
                    else:
                        snap.children[(kind, name)] = written
        snap.pods = self._store(BY_NAME["Pod"].index, key)
        snap.nodes = self.nodes()
        return snap

    def nodes(self) -> NodeCatalog:
        """The nodes' catalog, built again from the watch cache when a node's facts changed since."""
        with self._lock:  # built under the lock: a node changed meanwhile cannot be lost (rare: ms)
            if self._nodes is None:
                self._nodes = NodeCatalog(self._store(BY_NAME["Node"].index, "nodes"))
            return self._nodes
