"""Which pods must have their chatfleet.io/fallback annotation written (pure).

spec.fallback reaches the chat API of every pod of the ChatbotService, of every track, as that pod's
annotation, which a downward API volume writes into the chat API's settings file (builders/deployment.py);
kubelet rewrites the file when the annotation changes and the chat API re-reads it, so a change of the
FAQ or the breaker restarts nothing and starts no release. The pod template never carries it: a new
pod starts with the pod's defaults and is annotated by the pass its arrival in the Deployment's counts
starts (long before its model has loaded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet_operator.converge.facts import PodFacts, text_digest


@dataclass(frozen=True)
class PodAnnotation:
    """One pod whose chatfleet.io/fallback annotation must change."""

    name: str
    value: str | None
    """The annotation's new text; None: remove it (spec.fallback was removed)."""


def plan_fallback(pods: Sequence[PodFacts], value: str | None) -> list[PodAnnotation]:
    """The pods (not being deleted) whose annotation differs from `value`, by name.

    e.g. value '{"faq":[]}', pods a (already so), b (none) -> [b]; value None, a annotated -> [a None].
    """
    want = text_digest(value)
    return [
        PodAnnotation(p.name, value)
        for p in sorted(pods, key=lambda p: p.name)
        if not p.deleting and p.fallback_digest != want
    ]
