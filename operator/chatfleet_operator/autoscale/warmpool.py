"""The warm pool: which Ready pods of the stable track serve, which stand by. Pure.

With spec.scaling.autoscale.warmPool.replicas = P, the stable Deployment runs desired + P pods; the
Service and status.selector select chatfleet.io/serving=true. Each pass labels exactly `desired` Ready
pods serving (those already serving first, so no pod flaps), and every other pod "false" -- so a serving
pod that dies or turns unready is replaced at once by a warm Ready one, and a scale-up takes Ready
standby pods first while the Deployment refills the pool. Pods not serving get a low
controller.kubernetes.io/pod-deletion-cost, so a scale-down removes standby and drained pods, never
serving ones.

Under GPU scarcity the pool is the first to wait: pods are not tied to a role, and only Ready pods are
labelled serving, so whichever pods find a GPU serve first and the pool is what is left over. While a
release's new revision waits for GPUs, the pool is given up (`pool_size` returns 0) so its GPUs go to
the release. Canary and preview pods are never in the pool: their template says serving=true.

With spec.scaling.autoscale.surge the pool is sized for the surge instead (`surge_pool`, at least
warmPool.replicas): the standbys that let demand grow `factor`-fold within `withinSeconds`, when that is
shorter than a decision and a model load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet_operator import api
from chatfleet_operator.converge.diagnose import Problem
from chatfleet_operator.converge.facts import PodFacts
from chatfleet_operator.spec import SloSpec, SurgeSpec

STANDBY_DELETION_COST = api.STANDBY_DELETION_COST


@dataclass(frozen=True)
class PodLabel:
    """One pod whose serving label or deletion cost must change."""

    name: str
    serving: str
    deletion_cost: str | None
    """The annotation's new value; None: remove it."""


#: Seconds from a surge to the HPA's decision without an SLO: its sync period and a scrape (15 s each,
#: the defaults; the operator cannot read the controller's flag).
HPA_DECISION_SECONDS = 30.0


@dataclass(frozen=True)
class SurgePool:
    """The standbys a declared surge asks for, and why (status.autoscaling.surge)."""

    standby: int
    reason: str
    decision_seconds: float
    """How long after a surge begins the fleet decides to grow (the SLO's breach, else the HPA's sync)."""


def surge_pool(
    surge: SurgeSpec,
    serving: int,
    max_replicas: int,
    load_seconds: float | None,
    slo: SloSpec | None = None,
) -> SurgePool:
    """Standby replicas that let `serving` replicas' worth of demand grow `factor`-fold within `withinSeconds`.

    New pods serve only after a model load; when the decision plus a load fits in withinSeconds, none are
    needed. Otherwise the pool holds ceil(serving * factor) - serving replicas, loaded, within maxReplicas
    (serving + pool <= maxReplicas: a surge beyond maxReplicas is not absorbed). e.g. factor 5 within
    10 s, 2 serving, load 40 s, max 13 -> 8 standbys; 12 serving -> 1 (maxReplicas).
    """
    decision = (slo.breach_seconds + slo.check_seconds) if slo is not None else HPA_DECISION_SECONDS
    head = f"{surge.factor:g}x within {surge.within_seconds} s"
    if load_seconds is not None and decision + load_seconds <= surge.within_seconds:
        return SurgePool(
            0,
            f"{head}: a decision ({decision:g} s) and a model load ({load_seconds:g} s) fit in it",
            decision,
        )
    wanted = max(0, math.ceil(serving * surge.factor - 1e-9) - serving)
    standby = max(0, min(wanted, max_replicas - serving))
    load = "not measured yet" if load_seconds is None else f"{load_seconds:g} s"
    reason = f"{head} of {serving} serving: {wanted} more loaded ahead (model load {load})"
    if standby < wanted:
        reason += f", {standby} within maxReplicas {max_replicas}"
    if decision > surge.within_seconds:
        reason += f"; the decision to grow takes about {decision:g} s" + (
            "" if slo is not None else " (the HPA's sync: spec.scaling.autoscale.slo decides sooner)"
        )
    return SurgePool(standby, reason, decision)


def pool_size(requested: int, release_waits_for_gpus: bool) -> int:
    """Standby replicas wanted now: the spec's, or 0 while a release waits for GPUs. e.g. (2, True) -> 0."""
    return 0 if release_waits_for_gpus else requested


def plan_serving(pods: Sequence[PodFacts], desired: int) -> list[PodLabel]:
    """The label changes that leave exactly min(desired, Ready pods) Ready stable pods serving.

    Ready pods already serving keep serving (oldest name first when there are too many); then Ready
    standby pods join, by name. Not-Ready pods never serve; one that is not serving is left alone (its
    template already says serving=false at a low deletion cost), so a loading pod gets no writes.
    e.g. Ready a(true) b(false) c(false), desired 2 -> [b true]; desired 1 with a, b serving -> [b false];
    a(true) not Ready, b(false) Ready, desired 1 -> [a false, b true].
    """
    live = [p for p in pods if p.track == api.TRACK_STABLE and not p.deleting]
    ready = sorted((p for p in live if p.ready), key=lambda p: (p.serving != "true", p.name))
    chosen = {p.name for p in ready[: max(0, desired)]}
    changes = []
    for p in sorted(live, key=lambda p: p.name):
        serving = "true" if p.name in chosen else "false"
        if not p.ready and p.serving != "true":
            continue
        cost = None if serving == "true" else STANDBY_DELETION_COST
        if p.serving != serving or (p.deletion_cost or None) != cost:
            changes.append(PodLabel(p.name, serving, cost))
    return changes


def pool_status(pods: Sequence[PodFacts], desired_pool: int, gpus_per_replica: int) -> dict[str, int]:
    """status.autoscaling.warmPool: standby pods wanted, Ready, and the GPUs standby pods hold.

    e.g. pool 2, stable pods a(serving) b(false, Ready) c(false, Pending on no node), 1 GPU each
    -> {desired 2, ready 1, gpus 1}.
    """
    standby = [p for p in pods if p.track == api.TRACK_STABLE and not p.deleting and p.serving == "false"]
    return {
        "desired": desired_pool,
        "ready": sum(1 for p in standby if p.ready),
        "gpus": sum(1 for p in standby if p.node_name) * gpus_per_replica,
    }


def pool_waits(problems: Sequence[Problem], pods: Sequence[PodFacts], desired: int) -> list[Problem]:
    """Problems without those of standby pods waiting for room, once `desired` stable pods are Ready.

    An unschedulable pod (or the Deployment's progress deadline passing for it) is a problem while the
    fleet is short of serving replicas; beyond them it is the pool waiting for a GPU, which is expected.
    e.g. 3 Ready stable pods, desired 3, one pool pod Unschedulable -> that problem dropped.
    """
    ready = sum(1 for p in pods if p.track == api.TRACK_STABLE and p.ready and not p.deleting)
    if ready < desired:
        return list(problems)
    waiting = (api.Reason.UNSCHEDULABLE, api.Reason.PROGRESS_DEADLINE_EXCEEDED)
    return [p for p in problems if p.reason not in waiting]
