"""spec.rollout: the release strategy, its steps, the GitOps intents and sticky dialogues."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from chatfleet_operator.spec.fields import field_value, sub_mapping


@dataclass(frozen=True)
class CanaryStep:
    """One canary step: shift `weight` percent of traffic, pause, optionally analyse."""

    weight: int
    pause_seconds: int = 60
    analysis: bool = True


DEFAULT_CANARY_STEPS = (CanaryStep(10), CanaryStep(50), CanaryStep(100, 0, True))


class Strategy(StrEnum):
    """spec.rollout.strategy: how a new revision replaces the stable one (release/ has one module each)."""

    CANARY = "canary"
    BLUE_GREEN = "blueGreen"


@dataclass(frozen=True)
class StickyDialogues:
    """spec.rollout.stickyDialogues: keep each dialogue on the revision that answered its first turn."""

    enabled: bool = False
    idle_seconds: int = 300
    """A dialogue with no turn for this long has ended (the old revision is released after this much quiet)."""
    max_drain_seconds: int = 900
    """The longest the old revision keeps serving pinned dialogues after the last step."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StickyDialogues:
        """Parse spec.rollout.stickyDialogues."""
        return cls(
            enabled=bool(d.get("enabled") or False),
            idle_seconds=int(field_value(d, "idleSeconds", 300)),
            max_drain_seconds=int(field_value(d, "maxDrainSeconds", 900)),
        )


@dataclass(frozen=True)
class RolloutSpec:
    """spec.rollout: the strategy, its parameters, and the GitOps intents (paused, promote, abort, retry)."""

    strategy: Strategy = Strategy.CANARY
    canary_steps: tuple[CanaryStep, ...] = DEFAULT_CANARY_STEPS
    blue_green_auto_promotion: bool = False
    blue_green_auto_promotion_seconds: int = 0
    blue_green_preview_replicas: int = 1
    blue_green_scale_down_delay_seconds: int = 30
    paused: bool = False
    """spec.rollout.paused: hold the release at its step."""
    promote: str = ""
    """spec.rollout.promote: the revision to promote now ('*' any)."""
    abort: str = ""
    """spec.rollout.abort: the revision to roll back now ('*' any)."""
    retry: str = ""
    """spec.rollout.retry: a token; a rolled-back release of the spec's revision starts again when the token
    differs from the one that release started with (`kubectl chatbot retry` writes the time)."""
    gpu_capacity: str = "Auto"
    """spec.rollout.gpuCapacity: Surge, ReplaceInPlace, or Auto (surge until a pod finds no GPU)."""
    sticky: StickyDialogues = field(default_factory=StickyDialogues)
    """spec.rollout.stickyDialogues."""
    hostnames: tuple[str, ...] = ()
    """spec.rollout.hostnames: the HTTPRoute's hostnames (none: every hostname its listener admits)."""

    def wants(self, intent: str, revision: str) -> bool:
        """Whether an intent field (self.promote, self.abort) names this revision ('*' names any)."""
        return bool(intent) and intent in (revision, "*")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RolloutSpec:
        """Parse spec.rollout."""
        canary = sub_mapping(d, "canary")
        bg = sub_mapping(d, "blueGreen")
        steps = canary.get("steps")
        return cls(
            strategy=Strategy(d["strategy"]) if d.get("strategy") in set(Strategy) else Strategy.CANARY,
            canary_steps=tuple(
                CanaryStep(
                    int(s["weight"]),
                    int(field_value(s, "pauseSeconds", 60)),
                    bool(field_value(s, "analysis", True)),
                )
                for s in steps
            )
            if steps
            else DEFAULT_CANARY_STEPS,
            blue_green_auto_promotion=bool(field_value(bg, "autoPromotion", False)),
            blue_green_auto_promotion_seconds=int(field_value(bg, "autoPromotionSeconds", 0)),
            blue_green_preview_replicas=int(field_value(bg, "previewReplicas", 1)),
            blue_green_scale_down_delay_seconds=int(field_value(bg, "scaleDownDelaySeconds", 30)),
            paused=bool(d.get("paused") or False),
            promote=str(d.get("promote") or ""),
            abort=str(d.get("abort") or ""),
            retry=str(d.get("retry") or ""),
            gpu_capacity=str(d.get("gpuCapacity") or "Auto"),
            sticky=StickyDialogues.from_dict(sub_mapping(d, "stickyDialogues")),
            hostnames=tuple(str(h) for h in d.get("hostnames") or ()),
        )
