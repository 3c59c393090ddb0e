"""Which replica serves a request: dialogue affinity, revision stickiness, load. Pure (no I/O, no clock of its own).

The gateway has already chosen the pool (the track, by the HTTPRoute's weights) when it asks the picker.
For a request of a dialogue the picker has seen, that choice is overruled:

1. **affinity**: the turn goes to the replica that answered the dialogue's last turn (it holds the
   dialogue's prefix KV), unless that replica is saturated (its queue at its limit) and another of its
   revision is not, or it is gone;
2. **revision**: otherwise to the least-loaded replica of the revision that answered the dialogue's first
   turn, on whichever track it now is: a dialogue never switches revision while a replica of its revision
   serves (a canary's weights move, a promotion relabels it, and no client header is needed);
3. **new**: a dialogue seen for the first time (or whose revision has no replica left) goes to the
   least-loaded replica of a track chosen by the route's weights. Where the picker knows them
   (`set_weights`: it reads the HTTPRoute), new dialogues take the tracks in a smooth weighted round
   robin, so each track's share of them is its weight to within one dialogue at any count (the
   gateway's own weighted choice is random per request: at 20 % over 60 dialogues it lands anywhere
   from about 10 to 30 %); otherwise they take the track the gateway chose.

Load is read from the replica's metrics: its queue (requests in flight or waiting) and the fill of its
KV prefix store. Saturation is the queue alone: the runtime admits a request into its running batch only
while the batch's KV fits its budget, so KV pressure shows as requests waiting, while the prefix store
is an LRU cache that fills up by design (a full one is a warm replica, not a busy one: counting it as
saturation moved dialogues off the replicas holding their prefixes). New dialogues go to the replica
with the least queue plus picks sent to it since its metrics were read, then the least-filled prefix
store (room for the new dialogue's prefix without evicting others); ties go by a hash of the dialogue
and the address, so equal replicas share new dialogues instead of one taking them all. A request without
a dialogue key is a new dialogue each time (nothing to keep).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

AFFINITY, REVISION, NEW, ANY = "affinity", "revision", "new", "any"


@dataclass(frozen=True)
class Endpoint:
    """One replica as the picker sees it: where, what it serves, how loaded."""

    address: str
    """host:port of the chat port."""
    revision: str
    track: str
    ready: bool = True
    queue: float = 0.0
    """Requests in flight or waiting (chatfleet_inflight_requests)."""
    kv_usage: float = 0.0
    """Fill of the replica's KV prefix store, 0..1 (orders new dialogues; never saturation)."""


@dataclass(frozen=True)
class Limits:
    """When a replica counts as saturated (a dialogue then leaves it for another of its revision)."""

    max_queue: float = 8.0
    sessions: int = 100_000
    """Dialogues remembered (least recently used forgotten first)."""
    session_ttl_s: float = 3600.0
    """A dialogue idle this long is forgotten (its KV is gone from the replica by then)."""


@dataclass(frozen=True)
class Choice:
    address: str
    reason: str
    """AFFINITY (kept on its replica), REVISION (moved within its revision), NEW (track's least loaded),
    ANY (the chosen track has no ready replica: any ready one)."""
    revision: str


@dataclass
class _Dialogue:
    address: str
    revision: str
    seen: float


class Picker:
    """Remembers dialogues (address and revision) and picks replicas; `observe` feeds fresh load."""

    def __init__(self, limits: Limits | None = None, clock: Callable[[], float] | None = None) -> None:
        self.limits = limits or Limits()
        self._clock = clock or (lambda: 0.0)
        self._dialogues: OrderedDict[str, _Dialogue] = OrderedDict()
        self._sent: dict[str, int] = {}
        """Picks per address since that address's load was last observed."""
        self._weights: dict[str, int] | None = None
        self._credit: dict[str, int] = {}
        """Smooth weighted round robin's current weight per track (new dialogues)."""

    def __len__(self) -> int:
        return len(self._dialogues)

    def observe(self, addresses: Iterable[str], present: Iterable[str]) -> None:
        """Fresh metrics were read for `addresses`: their picks-since-read restart at zero; the counts of
        addresses no longer in the fleet (`present`: every replica now) are dropped, so pod churn leaves
        nothing behind."""
        read, kept = set(addresses), set(present)
        self._sent = {a: n for a, n in self._sent.items() if a in kept and a not in read}

    def set_weights(self, weights: Mapping[str, int] | None) -> None:
        """The route's weights by track (None: unknown, new dialogues take the gateway's track). A change
        starts the round robin afresh, so each of a canary's steps gets its own weight's share."""
        fresh = dict(weights) if weights else None
        if fresh != self._weights:
            self._weights, self._credit = fresh, {}

    def new_track(self, track: str, ready: Sequence[Endpoint]) -> str:
        """The track of a new dialogue: the next of a smooth weighted round robin (nginx's) over the
        weighted tracks that have a ready replica; `track` (the gateway's choice) without weights.

        e.g. weights stable 80, canary 20: stable, stable, canary, stable, stable, then again.
        """
        live = {e.track for e in ready}
        weights = {t: w for t, w in (self._weights or {}).items() if w > 0 and t in live}
        if not weights:
            return track
        for t, w in weights.items():
            self._credit[t] = self._credit.get(t, 0) + w
        best = max(sorted(weights), key=lambda t: self._credit[t])
        self._credit[best] -= sum(weights.values())
        return best

    def saturated(self, e: Endpoint) -> bool:
        """At its queue limit, by its last metrics (picks since then only order new dialogues: most have
        finished by the next read, so counting them would move dialogues off idle replicas)."""
        return e.queue >= self.limits.max_queue

    def pick(
        self, dialogue: str | None, track: str, endpoints: Sequence[Endpoint], by_weight: bool = True
    ) -> Choice | None:
        """The replica for one request of `dialogue` (None: no key) routed by the gateway to `track`; a
        new dialogue's track is the weights' (`new_track`) unless not `by_weight` (the gateway's route
        pinned this request to its pool)."""
        ready = [e for e in endpoints if e.ready]
        if not ready:
            return None
        now = self._clock()
        known = self._recall(dialogue, now) if dialogue else None
        choice: Choice | None = None
        if known is not None:
            same = [e for e in ready if e.revision == known.revision]
            home = next((e for e in same if e.address == known.address), None)
            if home is not None and not self.saturated(home):
                choice = Choice(home.address, AFFINITY, home.revision)
            elif same:
                best = self._least_loaded(dialogue, same)
                if home is not None and self.saturated(best):  # all saturated: moving loses the prefix
                    choice = Choice(home.address, AFFINITY, home.revision)
                else:
                    choice = Choice(best.address, REVISION, best.revision)
        if choice is None:
            track = self.new_track(track, ready) if by_weight else track
            on_track = [e for e in ready if e.track == track]
            best = self._least_loaded(dialogue, on_track or ready)
            choice = Choice(best.address, NEW if on_track else ANY, best.revision)
        self._sent[choice.address] = self._sent.get(choice.address, 0) + 1
        if dialogue:
            self._remember(dialogue, choice, now)
        return choice

    def _queue(self, e: Endpoint) -> float:
        return e.queue + self._sent.get(e.address, 0)

    def _least_loaded(self, dialogue: str | None, endpoints: Sequence[Endpoint]) -> Endpoint:
        def load(e: Endpoint) -> tuple[bool, float, float, str]:
            return (self.saturated(e), self._queue(e), round(e.kv_usage, 2), _tiebreak(dialogue, e.address))

        return min(endpoints, key=load)

    def _recall(self, dialogue: str, now: float) -> _Dialogue | None:
        known = self._dialogues.get(dialogue)
        if known is None:
            return None
        if now - known.seen > self.limits.session_ttl_s:
            del self._dialogues[dialogue]
            return None
        return known

    def _remember(self, dialogue: str, choice: Choice, now: float) -> None:
        # AFFINITY and REVISION keep the dialogue's revision; NEW and ANY happen only when it has no
        # replica left (or the dialogue is new), so the dialogue takes the one it lands on.
        self._dialogues[dialogue] = _Dialogue(choice.address, choice.revision, now)
        self._dialogues.move_to_end(dialogue)
        while len(self._dialogues) > self.limits.sessions:
            self._dialogues.popitem(last=False)


def _tiebreak(dialogue: str | None, address: str) -> str:
    """Rendezvous order of `address` for `dialogue`: equal replicas split new dialogues between them."""
    return hashlib.blake2s(f"{dialogue or ''}|{address}".encode(), digest_size=8).hexdigest()
