"""The upgrade wave: what the operator itself changes in the fleets reaches at most N at a time.

A new operator build, or new operator settings (`helm upgrade`), can change every fleet at once:
- a new pod template with the same revision (a new annotation, an env var, a probe, the chat API's
  resources): every stable Deployment would roll together;
- a new default runtime image (or Prometheus address), which changes the effective spec's revision of
  every fleet that names none: every such fleet would start a release together.
So both take a place in the wave first (`PodSettings.upgrade_wave`, flag --upgrade-wave). A template
change rolls through the Deployment's usual rolling update (one pod at a time, each draining) and frees
its place once rolled out; an operator release runs with its canary and analysis (`status.release.origin:
operator`) and frees its place once promoted. Fleets without a place keep their pods (the stable
Deployment keeps its observed template, no release starts) and say so in condition UpgradeHeld. A fleet
whose update fails (its release rolled back, crash-looping or unpullable pods, the progress deadline)
halts the wave: nothing more is admitted until it recovers or is deleted.

A release of a spec change never waits (the user asked for it); neither does a new fleet. A spec change
outside the revision's fields that changes the template (spec.scaling.warmPool) is a same-revision
template change too, and takes the same path (admitted at once while the wave has room).

The wave is this process's memory. A restarted operator counts again the fleets part-way through a
same-revision rollout (old pods still up) and those in a release of origin operator, so it never admits
N more on top. `template_upgrade`, `operator_release`, `rollout_state`, `upgrade_failure` and
`held_condition` are pure; `UpgradeWave` is the shared registry.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.converge.changes import contains
from chatfleet_operator.converge.diagnose import Problem
from chatfleet_operator.converge.facts import DeploymentFacts, PodFacts
from chatfleet_operator.converge.status import condition
from chatfleet_operator.release.planner import starts_release
from chatfleet_operator.release.state import ReleasePhase, ReleaseStatus
from chatfleet_operator.release.strategy import ReleasePlan

Key = tuple[str, str]  # (namespace, ChatbotService name)

#: status.release.origin of a release the operator's own defaults started.
ORIGIN_OPERATOR = "operator"


@dataclass(frozen=True)
class Answer:
    """The wave's word on one fleet's upgrade: admitted, or held (queued behind full places, or halted)."""

    admitted: bool
    reason: str = ""
    message: str = ""


class UpgradeWave:
    """Which fleets are updating now; at most `size` (0: no limit). Thread-safe.

    A fleet takes a place when `ask` admits it, or when a pass finds it updating without this process
    having admitted it (`observe(..., counted=True)`: after a restart). Only the failure of a fleet the
    wave answers for halts it: one it admitted, or a release of origin operator (`vouched`). A rollout
    merely found part-way takes a place but halts nothing: this process cannot tell it was an upgrade.
    """

    def __init__(self, size: int = 0) -> None:
        self.size = size
        self._rolling: set[Key] = set()
        self._answers_for: set[Key] = set()
        self._failing: dict[Key, str] = {}
        self._lock = threading.Lock()

    def ask(self, key: Key) -> Answer:
        """Admit `key`'s update now (it takes a place), or say why it waits."""
        with self._lock:
            if key in self._rolling:
                self._answers_for.add(key)
                return Answer(True)
            if self._failing:
                (ns, name), why = sorted(self._failing.items())[0]
                return Answer(
                    False,
                    api.Reason.UPGRADE_HALTED,
                    f"The upgrade wave is halted: ChatbotService {ns}/{name} failed its update ({why}); "
                    "this fleet keeps its pods until that one recovers or is deleted",
                )
            if self.size and len(self._rolling) >= self.size:
                return Answer(
                    False,
                    api.Reason.UPGRADE_QUEUED,
                    f"The operator's update of this fleet (a new pod template or default image) waits for a "
                    f"place: {len(self._rolling)} of {self.size} fleets are updating (--upgrade-wave)",
                )
            self._rolling.add(key)
            self._answers_for.add(key)
            return Answer(True)

    def observe(
        self, key: Key, updating: bool, failing: str, counted: bool = False, vouched: bool = False
    ) -> bool:
        """After a pass: `updating` whether the fleet's update goes on; `failing` why it fails ('' when it
        does not); `counted`: take a place even if this process did not admit it (found updating after a
        restart), past the size if need be; `vouched`: its failure halts the wave even so (a release of
        origin operator). True when a place freed or a halt lifted."""
        with self._lock:
            if key not in self._rolling and not (counted and updating):
                return False
            was_failing = key in self._failing
            if not updating:
                self._discard(key)
                return True
            self._rolling.add(key)
            if vouched:
                self._answers_for.add(key)
            if failing and key in self._answers_for:
                self._failing[key] = failing
                return False
            self._failing.pop(key, None)
            return was_failing

    def forget(self, key: Key) -> None:
        """A deleted ChatbotService frees its place (and lifts a halt it caused)."""
        with self._lock:
            self._discard(key)

    def _discard(self, key: Key) -> None:
        self._rolling.discard(key)
        self._answers_for.discard(key)
        self._failing.pop(key, None)

    def rolling(self) -> list[Key]:
        """The fleets holding a place now."""
        with self._lock:
            return sorted(self._rolling)


def _template(deployment: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return ((deployment or {}).get("spec") or {}).get("template")


def template_upgrade(
    observed: Mapping[str, Any] | None, desired: Mapping[str, Any], update_revision: str
) -> bool:
    """Whether writing `desired` (the stable Deployment built from the spec) changes the observed one's pod
    template while its revision stays: an upgrade, which takes a place in the wave. Pure.

    e.g. same revision, a new annotation in the template -> True; a new revision (a release) -> False;
    no Deployment yet -> False; the same template -> False.
    """
    if observed is None or _template(observed) is None:
        return False
    labels = (observed.get("metadata") or {}).get("labels") or {}
    if labels.get(api.LABEL_REVISION) != update_revision:
        return False
    return not contains(observed, {"spec": {"template": _template(desired)}})


def operator_release(
    plan: ReleasePlan, old: ReleaseStatus, old_status: Mapping[str, Any], generation: int
) -> bool:
    """Whether this pass's plan starts a release the spec did not ask for: its generation was reconciled
    already and no release is in the status, yet the revision moved -- a new operator default (the runtime
    image) changed the effective spec. Such a release takes a place in the wave. Pure.

    e.g. observedGeneration 3, generation 3, no status.release, the plan starts a release -> True; the
    same with generation 4 (the user changed the spec) -> False.
    """
    return starts_release(plan) and old.release is None and old_status.get("observedGeneration") == generation


def rollout_state(dep: DeploymentFacts | None, plan: ReleasePlan) -> tuple[bool, bool]:
    """(updating, part_way): `updating` while a release runs (or stays rolled back) or the stable
    Deployment has not finished rolling out; `part_way` while its pods of an older template are still up
    outside a release (what a restarted operator counts). Pure."""
    if plan.in_release:
        return True, False
    if dep is None:
        return False, False
    return not dep.rolled_out, dep.observed_generation >= dep.generation and dep.updated < dep.replicas


def upgrade_failure(
    dep: DeploymentFacts | None, plan: ReleasePlan, problems: Sequence[Problem], looping: Sequence[PodFacts]
) -> str:
    """Why the fleet's update fails ('' when it does not): its release was rolled back, a problem the pass
    diagnosed (pods that cannot be scheduled or pulled, a missing Secret), crash-looping pods, or the
    Deployment's progress deadline. Pure."""
    rel = plan.release
    if plan.in_release and rel is not None and rel.phase == ReleasePhase.ROLLED_BACK:
        return f"its release of revision {rel.revision} was rolled back"
    if problems:
        return problems[0].message
    if looping:
        return f"pod {looping[0].name} is crash-looping ({looping[0].restarts} restarts)"
    if dep is not None and dep.deadline_exceeded:
        return "the Deployment passed its progress deadline"
    return ""


def held_condition(answer: Answer, generation: int) -> dict[str, Any]:
    """Condition UpgradeHeld=True with the wave's reason and message (no timestamp)."""
    return condition(api.COND_UPGRADE_HELD, True, answer.reason, answer.message, generation)
