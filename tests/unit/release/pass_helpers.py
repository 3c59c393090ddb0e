"""One pass's context and children from a raw spec, as reconcile_pass gathers and plans them (no API)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from chatfleet_operator.cache import Snapshot
from chatfleet_operator.context import PassContext
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.reconcile import gather_context
from chatfleet_operator.release.children import desired_children, plan_pass
from chatfleet_operator.release.strategy import ReleasePlan
from chatfleet_operator.settings import Settings
from chatfleet_operator.spec import ObjectRef

REF = ObjectRef("ns", "bot", "uid-1", 2)
NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def context(
    raw: Mapping[str, Any],
    *,
    children: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    pods: Iterable[PodFacts] = (),
    status: Mapping[str, Any] | None = None,
    now: datetime = NOW,
    traffic: str = "ReplicaRatio",
    ref: ObjectRef = REF,
    settings: Settings | None = None,
    backends: str = "Service",
) -> PassContext:
    """The context reconcile_pass gathers for a ChatbotService with spec `raw` and status `status`."""
    meta = {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid, "generation": ref.generation}
    body = {"metadata": meta, "spec": dict(raw), "status": dict(status or {})}
    snap = Snapshot(children=dict(children or {}), pods=list(pods))
    return gather_context(body, snap, settings or Settings(), now, traffic, backends=backends)


def pass_children(ctx: PassContext) -> tuple[ReleasePlan, list[dict[str, Any]]]:
    """(release plan, desired children) of one pass over `ctx`."""
    plan = plan_pass(ctx)
    return plan, desired_children(ctx, plan)


def by_key(desired: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Any]:
    """Manifests by (kind, name)."""
    return {(m["kind"], m["metadata"]["name"]): m for m in desired}
