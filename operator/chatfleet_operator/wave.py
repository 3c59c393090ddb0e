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
`held_condition` are pure; `UpgradeWave` is the shared registry; a pass meets the wave twice, through
`plan_in_wave` (its plan and children, held back where the wave has no place) and `report_to_wave` (how
its update stands once applied).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.builders.common import deployment_name
from chatfleet_operator.context import PassContext
from chatfleet_operator.converge.changes import contains
from chatfleet_operator.converge.diagnose import Problem, crashlooping
from chatfleet_operator.converge.facts import DeploymentFacts, PodFacts
from chatfleet_operator.converge.status import condition
from chatfleet_operator.release.children import desired_children, plan_pass
from chatfleet_operator.release.planner import starts_release
from chatfleet_operator.release.state import ReleasePhase, ReleaseStatus
from chatfleet_operator.release.strategy import ReleasePlan

Key = tuple[str, str]  # (namespace, ChatbotService name)

log = logging.getLogger("chatfleet")

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
        origin operator). True when a place freed, or a halt began or lifted: the fleets held meanwhile
        pass again, to go or to say the wave is halted (a held fleet has no timer of its own)."""
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
                return not was_failing
            self._failing.pop(key, None)
            return was_failing

    def forget(self, key: Key) -> bool:
        """A deleted ChatbotService frees its place (and lifts a halt it caused); True when it held one."""
        with self._lock:
            held = key in self._rolling
            self._discard(key)
            return held

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

    Only a change of what the operator builds counts: when `desired` carries the desired-hash the observed
    Deployment carries, the operator wants what it wrote last, and a template that differs was edited by
    someone else (drift, put back at once, never held). The hash also spares the template comparison on
    the passes where nothing changed.

    e.g. same revision, a new annotation in the built template -> True; a new revision (a release) -> False;
    no Deployment yet -> False; the same template -> False; the template edited by hand -> False.
    """
    if observed is None or _template(observed) is None:
        return False
    meta = observed.get("metadata") or {}
    if (meta.get("labels") or {}).get(api.LABEL_REVISION) != update_revision:
        return False
    wrote = (meta.get("annotations") or {}).get(api.ANNOTATION_DESIRED_HASH)
    wants = ((desired.get("metadata") or {}).get("annotations") or {}).get(api.ANNOTATION_DESIRED_HASH)
    if wrote is not None and wrote == wants:
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
    """(updating, part_way): `updating` while a release of origin operator runs (or stays rolled back) or
    the stable Deployment has not finished rolling out; `part_way` while its pods of an older template are
    still up outside a release (what a restarted operator counts). A release the user started takes the
    fleet out of the wave: it has its own gates. Pure."""
    if plan.in_release:
        return plan.release is not None and plan.release.origin == ORIGIN_OPERATOR, False
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


def plan_in_wave(
    ctx: PassContext, wave: UpgradeWave
) -> tuple[ReleasePlan, list[dict[str, Any]], Answer | None]:
    """A pass's plan and children (step 3), the operator's own updates held back where the wave has no
    place: a release of its new defaults does not start, a new pod template of the same revision is not
    written (the stable Deployment keeps its observed one). The wave's answer when something is held."""
    plan = plan_pass(ctx)
    held = None
    if operator_release(plan, ctx.release_status, ctx.old_status, ctx.ref.generation):
        held = _ask(ctx, wave, "release of the operator's new defaults")
        if held is not None:
            plan = plan_pass(ctx, hold=True)
        elif plan.release is not None:
            plan.release.origin = ORIGIN_OPERATOR
    desired = desired_children(ctx, plan)
    if held is None and plan.stable_from_spec:  # a release (or its rollback) keeps the stable template
        name = deployment_name(ctx.ref)
        stable = next(m for m in desired if m["kind"] == "Deployment" and m["metadata"]["name"] == name)
        if template_upgrade(ctx.observed("Deployment", name), stable, ctx.update_revision):
            held = _ask(ctx, wave, "new pod template")
            if held is not None:
                plan = replace(plan, stable_from_spec=False)
                desired = desired_children(ctx, plan)
    return plan, desired, held


def _ask(ctx: PassContext, wave: UpgradeWave, what: str) -> Answer | None:
    """The wave's answer when it has no place for this fleet's update; None when admitted."""
    answer = wave.ask((ctx.ref.namespace, ctx.ref.name))
    if not answer.admitted:
        return answer
    log.info(
        "Admitted the %s of ChatbotService %s/%s to the upgrade wave", what, ctx.ref.namespace, ctx.ref.name
    )
    return None


def report_to_wave(
    wave: UpgradeWave,
    ctx: PassContext,
    plan: ReleasePlan,
    dep: DeploymentFacts | None,
    problems: Sequence[Problem],
    stable_pods: Sequence[PodFacts],
) -> bool:
    """Tell the wave how this fleet's update stands after the pass; True when that freed a place, or began
    or lifted a halt (the held fleets must pass again). A release of origin operator, or a same-revision rollout found part-way outside a release,
    takes a place even when this process did not admit it (a restarted operator); only the first can
    halt the wave."""
    updating, part_way = rollout_state(dep, plan)
    looping = crashlooping(stable_pods, ctx.update_revision)
    failing = upgrade_failure(dep, plan, problems, looping) if updating else ""
    ours = plan.in_release and plan.release is not None and plan.release.origin == ORIGIN_OPERATOR
    found = part_way and ctx.stable.revision == ctx.update_revision
    key = (ctx.ref.namespace, ctx.ref.name)
    return wave.observe(key, updating, failing, counted=ours or found, vouched=ours)
