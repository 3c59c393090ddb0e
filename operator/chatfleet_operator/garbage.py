"""The operator process's cyclic garbage collector: the thresholds it runs with, and the CPU it spends.

Python collects a young generation every 700 new container objects, and every object that lives through
two young collections is promoted to the old generation; once the promoted objects reach a quarter of
the old ones, the collector walks every object the process holds. A watch event decodes into a few
hundred dicts and lists, which kopf queues per object and the watch caches keep; on a busy operator each
lives through two young collections before its handlers are done with it. So most decoded events were
promoted, and the process walked its whole heap again and again: with 1,000 ChatbotServices being
created, 31 full collections of up to 600,000 objects each, 6.8 of the operator's 25.9 CPU seconds
(docs/benchmarks.md, bench-operator, "Ten thousand, with the operator's garbage collector tuned").

What the operator holds is JSON trees without cycles, freed by reference counting as soon as a newer
version replaces them; the collector is there for the few cycles asyncio's tasks and exceptions make. A
young generation of 50,000 lets an event's objects die before a collection sees them, and 20 young
collections per middle one promote fewer still, for about a tenth more memory (garbage waits longer to be
collected). bench-operator reports the collector's CPU beside the operator's.
"""

from __future__ import annotations

import gc
import time
from typing import Any

#: The collector's thresholds (young, middle, old): see the module's docstring. Python's own: (700, 10, 10).
THRESHOLDS = (50_000, 20, 10)


class CollectorTime:
    """The collector's CPU seconds and collections per generation in this process (a `gc.callbacks` entry).

    Timed on the thread that collects (the collector holds the interpreter while it runs)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """gc's callback: "start" before a collection, "stop" after it, with its generation."""
        if phase == "start":
            self._started = time.thread_time()
            return
        generation = info["generation"]
        self.seconds[generation] += time.thread_time() - self._started
        self.collections[generation] += 1

    def figures(self) -> dict[str, Any]:
        """What the collector took so far: CPU seconds in all, and per generation with the collections."""
        return {
            "gc_seconds": round(sum(self.seconds), 3),
            "gc_seconds_by_generation": [round(s, 3) for s in self.seconds],
            "gc_collections": list(self.collections),
        }


_TIME = CollectorTime()


def tune() -> None:
    """Run the collector with THRESHOLDS and count its CPU time (the process's figures: `figures()`)."""
    gc.set_threshold(*THRESHOLDS)
    if _TIME not in gc.callbacks:
        gc.callbacks.append(_TIME)


def figures() -> dict[str, Any]:
    """The collector's CPU seconds and collections since `tune()` (zeros before)."""
    return _TIME.figures()
