"""Whether the cluster serves an API group, asked through discovery and cached a few seconds.

The release edge asks it for Gateway API (HTTPRoute or replica ratio), the autoscaling edge for keda.sh
(ScaledObject or HPA). A failing discovery keeps the last answer (False before any): it must never stop a pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("chatfleet")


class ServedGroup:
    """`served()`: the answer of `serves`, asked again once it is older than `cache_seconds`."""

    def __init__(self, group: str, serves: Callable[[], bool] | None, cache_seconds: float) -> None:
        self.group = group
        self._serves = serves or (lambda: False)
        self.cache_seconds = cache_seconds
        self._cached: tuple[float, bool] | None = None

    def forget(self) -> None:
        """Ask again at the next `served()` (the group's CRDs appeared or went)."""
        self._cached = None

    def served(self) -> bool:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] > self.cache_seconds:
            try:
                served = bool(self._serves())
            except Exception as exc:  # discovery failing must not stop the pass
                log.warning("Failed to discover the %s API group: %s", self.group, exc)
                served = self._cached[1] if self._cached else False
            self._cached = (now, served)
        return self._cached[1]
