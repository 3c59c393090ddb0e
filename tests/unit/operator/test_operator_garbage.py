"""The operator's garbage collector: decoded watch events die young instead of being promoted to the old
generation, whose every promotion counts towards a walk of the whole heap (garbage.py)."""

from __future__ import annotations

import gc
import json
from collections import deque

#: A watch event as kopf reads it: a few hundred containers the collector tracks (lists, and the dicts
#: holding them), like a pod or a Deployment with its managedFields.
EVENT = json.dumps(
    {
        "type": "MODIFIED",
        "object": {
            "metadata": {
                "name": "bot-0",
                "managedFields": [{"fieldsV1": {"f:spec": [[i] for i in range(120)]}}],
            },
            "spec": {"containers": [{"env": [[{"name": f"E{i}"}] for i in range(120)]}]},
        },
    }
)


def promoted_share(
    thresholds: tuple[int, int, int], events: int = 400, queued: int = 60, samples: int = 5
) -> float:
    """Decode `events` watch events, each queued behind `queued` others before its handler is done with it
    (as kopf queues them per object on a busy operator), while the watch cache grows by an object per event
    (ChatbotServices being created); return the share of the sampled events that were in the old
    generation when dropped. (The collector counts objects made less objects freed: the cache's growth is
    what makes it collect.)"""
    gc.collect()  # counts start from zero
    gc.set_threshold(*thresholds)
    queue: deque = deque()
    cache = []
    promoted = checked = 0
    every = (events - queued) // samples
    for i in range(events):
        queue.append(json.loads(EVENT))
        cache.append(json.loads(EVENT))
        if len(queue) <= queued:
            continue
        done = queue.popleft()
        if (i - queued) % every == 0 and checked < samples:
            checked += 1
            promoted += any(o is done for o in gc.get_objects(generation=2))
    return promoted / checked


def test_a_queued_watch_event_is_promoted_to_the_old_generation_with_pythons_thresholds():
    """Python's own thresholds: an event that waits behind 60 others lives through two collections."""
    assert promoted_share((700, 10, 10)) >= 0.8


def test_the_operators_collector_lets_a_queued_watch_event_die_young():
    """The operator's thresholds, set at its start-up: the same event is never promoted."""
    import kopf
    from chatfleet_operator import garbage, main

    main.configure(settings=kopf.OperatorSettings())
    assert gc.get_threshold() == garbage.THRESHOLDS
    assert promoted_share(gc.get_threshold()) == 0.0


def test_the_collectors_time_is_counted_per_generation():
    """The stats file's figures (bench-operator reports them): each collection counted in its generation."""
    from chatfleet_operator import garbage

    garbage.tune()
    before = garbage.figures()
    gc.collect(0)
    gc.collect(2)
    after = garbage.figures()
    assert after["gc_collections"][0] == before["gc_collections"][0] + 1
    assert after["gc_collections"][2] == before["gc_collections"][2] + 1
    assert after["gc_seconds"] >= before["gc_seconds"]
    assert garbage.tune() is None and gc.callbacks.count(garbage._TIME) == 1  # tuning twice adds nothing
