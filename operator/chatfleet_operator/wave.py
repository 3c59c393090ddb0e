"""The upgrade wave: pod-template changes that are no release reach at most N ChatbotServices at a time.

A new operator build, or new operator settings, can change every stable Deployment's pod template (a new
annotation, an env var, a probe) without changing any revision. Applied everywhere at once, every fleet
would restart together. So a template change of the stable Deployment *with the same revision* is an
upgrade, and it waits for a place in the wave (`PodSettings.upgrade_wave`, flag --upgrade-wave): the
fleets admitted roll through the Deployment's usual rolling update (one pod at a time, each draining),
and a place frees once its rollout is done. A fleet whose upgrade fails (crash-looping or unpullable pods,
the progress deadline) halts the wave: nothing more is admitted until it recovers or is deleted.
Releases (a new revision) never wait here: they have their own canary and analysis. A spec change outside
the revision's fields that changes the template (spec.scaling.warmPool) is a same-revision template
change too, and takes the same path (admitted at once while the wave has room).

The wave is this process's memory. A restarted operator counts again the fleets whose stable Deployment
is part-way through a same-revision rollout (old pods still up), so it never admits more than N on top.
`template_upgrade`, `rollout_state`, `upgrade_failure` and `held_condition` are pure; `UpgradeWave` is the shared registry.
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

Key = tuple[str, str]  # (namespace, ChatbotService name)


@dataclass(frozen=True)
class Answer:
    """The wave's word on one fleet's upgrade: admitted, or held (queued behind full places, or halted)."""

    admitted: bool
    reason: str = ""
    message: str = ""


class UpgradeWave:
    """Which fleets are rolling an upgrade now; at most `size` (0: no limit). Thread-safe."""

    def __init__(self, size: int = 0) -> None:
        self.size = size
        self._rolling: set[Key] = set()
        self._failing: dict[Key, str] = {}
        self._lock = threading.Lock()

    def ask(self, key: Key) -> Answer:
        """Admit `key`'s upgrade now (it takes a place), or say why it waits."""
        with self._lock:
            if key in self._rolling:
                return Answer(True)
            if self._failing:
                (ns, name), why = sorted(self._failing.items())[0]
                return Answer(
                    False,
                    api.Reason.UPGRADE_HALTED,
                    f"The upgrade wave is halted: ChatbotService {ns}/{name} failed its upgrade ({why}); "
                    "this fleet keeps its pods until that one recovers or is deleted",
                )
            if self.size and len(self._rolling) >= self.size:
                return Answer(
                    False,
                    api.Reason.UPGRADE_QUEUED,
                    f"The operator's new pod template waits for a place: {len(self._rolling)} of "
                    f"{self.size} fleets are rolling theirs (--upgrade-wave)",
                )
            self._rolling.add(key)
            return Answer(True)

    def observe(self, key: Key, rolling: bool, failing: str, recovered: bool = False) -> bool:
        """After a pass: `rolling` whether its stable Deployment is still rolling out; `failing` why that
        rollout fails ('' when it does not); `recovered`: a same-revision rollout found part-way (after a
        restart), counted in the wave even past its size. True when a place freed or a halt lifted."""
        with self._lock:
            if key not in self._rolling and not (recovered and rolling):
                return False
            was_failing = key in self._failing
            if not rolling:
                self._rolling.discard(key)
                self._failing.pop(key, None)
                return True
            self._rolling.add(key)
            if failing:
                self._failing[key] = failing
                return False
            self._failing.pop(key, None)
            return was_failing

    def forget(self, key: Key) -> None:
        """A deleted ChatbotService frees its place (and lifts a halt it caused)."""
        with self._lock:
            self._rolling.discard(key)
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


def rollout_state(dep: DeploymentFacts | None) -> tuple[bool, bool]:
    """(rolling, part_way) of the stable Deployment: `rolling` until every pod runs its template and is
    available; `part_way` while pods of an older template are still up (what a restarted operator counts).
    Pure. A Deployment that is gone rolls nothing."""
    if dep is None:
        return False, False
    return not dep.rolled_out, dep.observed_generation >= dep.generation and dep.updated < dep.replicas


def upgrade_failure(
    dep: DeploymentFacts | None, problems: Sequence[Problem], looping: Sequence[PodFacts]
) -> str:
    """Why the stable Deployment's rollout fails ('' when it does not): a problem the pass diagnosed
    (pods that cannot be scheduled or pulled, a missing Secret), crash-looping pods, or the Deployment's
    progress deadline. Pure."""
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
