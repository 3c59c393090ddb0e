"""Which replica a chat request goes to: the replicas in turn (``Upstreams``: a list, the addresses a name
resolves to, or one load balancer), and the replica of each dialogue (``Affinity``: the one that answered
its last turn, which named its own address). Used by the relay's server."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger("chatfleet.relay")


def dialogue_key(headers: Mapping[str, str], body: object) -> str | None:
    """The dialogue a chat request belongs to, as the chat API finds its session: the ``X-Session-Id``
    header, the body's ``session_id``, the body's ``user``; None for a request of no dialogue. Not checked
    here (the chat API refuses a bad one). A digest (32 hex digits), so that what the relay keeps is
    small whatever the client sent, and holds no user's name.

    >>> len(dialogue_key({"x-session-id": "s1"}, {})), dialogue_key({}, {"user": "u"}) == dialogue_key({}, {"user": "u"})
    (32, True)
    >>> dialogue_key({}, {"user": "u"}) == dialogue_key({}, {"session_id": "u"}), dialogue_key({}, [])
    (False, None)
    """
    sid = next((v for k, v in headers.items() if k.lower() == "x-session-id"), None)
    found = f"header:{sid}" if sid else None
    if found is None and isinstance(body, dict):
        for field_name in ("session_id", "user"):
            value = body.get(field_name)
            if isinstance(value, str) and value:
                found = f"{field_name}:{value}"
                break
    return hashlib.blake2b(found.encode(), digest_size=16).hexdigest() if found else None


def replica_url(address: str | None) -> str | None:
    """The base URL of the replica that named itself ``address`` (an IP and a port), None for anything else.

    >>> replica_url("10.245.0.3:8080"), replica_url("[fd00::3]:8080"), replica_url("evil.example:80")
    ('http://10.245.0.3:8080', 'http://[fd00::3]:8080', None)
    """
    host, _, port = (address or "").rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        number = int(port)
    except ValueError:
        return None
    if not 0 < number < 65536:
        return None
    return f"http://[{ip}]:{number}" if ip.version == 6 else f"http://{ip}:{number}"


@dataclass
class Affinity:
    """The replica (base URL) that answered each dialogue's last turn, so its next turns go there. At most
    ``limit`` dialogues, the least recently used forgotten first."""

    limit: int = 100_000
    _last: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def get(self, key: str | None) -> str | None:
        if key is None or key not in self._last:
            return None
        self._last.move_to_end(key)
        return self._last[key]

    def put(self, key: str | None, url: str | None) -> None:
        if key is None or url is None:
            return
        self._last[key] = url
        self._last.move_to_end(key)
        while len(self._last) > self.limit:
            self._last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)


@dataclass
class Upstreams:
    """The chat API replicas, in turn; a replica that failed is tried after the others for ``cooldown_s``.

    ``balanced``: the one URL is a load balancer (a Service's ClusterIP: each new connection may reach
    another replica), so it is never set aside: a request tries it up to ``balanced_tries`` times,
    ``balanced_pause_s`` apart (a replica that just died may take a few seconds to leave it)."""

    urls: list[str]
    resolve: bool = False
    balanced: bool = False
    balanced_tries: int = 6
    balanced_pause_s: float = 0.5
    cooldown_s: float = 5.0
    resolve_every_s: float = 2.0
    clock: object = time.monotonic
    _next: int = 0
    answered_within_s: float = 10.0
    _failed: dict[str, float] = field(default_factory=dict)
    _answered: dict[str, float] = field(default_factory=dict)
    _resolved: list[str] = field(default_factory=list)
    _resolved_at: float = float("-inf")

    async def _addresses(self) -> list[str]:
        """Every replica URL: with ``resolve``, one per address each name resolves to (read again every
        ``resolve_every_s``; the last answer kept when resolving fails)."""
        if not self.resolve:
            return self.urls
        now = self.clock()
        if now - self._resolved_at < self.resolve_every_s and self._resolved:
            return self._resolved
        loop = asyncio.get_running_loop()
        found: list[str] = []
        for url in self.urls:
            parts = urlsplit(url)
            try:
                infos = await loop.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("resolving %s: %s", parts.hostname, exc)
                continue
            for ip in sorted({info[4][0] for info in infos}):
                host = f"[{ip}]" if ":" in ip else ip
                found.append(urlunsplit(parts._replace(netloc=f"{host}:{parts.port or 80}")))
        if found:
            self._resolved, self._resolved_at = found, now
        return self._resolved or self.urls

    async def order(self, tried: set[str], advance: bool = True, first: str | None = None) -> list[str]:
        """The replicas not tried yet for this request: ``first`` (the dialogue's replica) unless it was
        tried or failed lately, then round robin (chat requests take turns; a GET does not move the turn),
        those that failed lately last; balanced: after ``first``, the one URL ``balanced_tries`` times,
        and before it, when this request already tried one or its dialogue's replica cannot take it (a
        resume, a dialogue that moves), the replicas that answered in the last ``answered_within_s``, in
        random order: through the balancer it might reach the replica that just failed again."""
        now = self.clock()
        head = [first] if first and first not in tried and not self._cooling(first, now) else []
        if self.balanced:
            if tried or (first and not head):
                live = [
                    u
                    for u, at in self._answered.items()
                    if now - at < self.answered_within_s
                    and u not in tried
                    and u not in head
                    and not self._cooling(u, now)
                ]
                head += random.sample(live, len(live))
            return [*head, *self.urls[:1] * self.balanced_tries]
        urls = [u for u in await self._addresses() if u not in head]
        if not urls:
            return head
        start = self._next % len(urls)
        if advance:
            self._next += 1
        turn = [u for u in urls[start:] + urls[:start] if u not in tried]
        return [*head, *sorted(turn, key=lambda u: self._cooling(u, now))]

    def _cooling(self, url: str, now: float) -> bool:
        return now - self._failed.get(url, float("-inf")) < self.cooldown_s

    def failed(self, url: str) -> None:
        _stamp(self._failed, url, self.clock(), self.cooldown_s)

    def answered(self, url: str | None) -> None:
        """`url` (a replica's own address) answered a request just now."""
        if url is not None:
            _stamp(self._answered, url, self.clock(), self.answered_within_s)


def _stamp(seen: dict[str, float], url: str, now: float, keep_s: float, most: int = 1024) -> None:
    """`url` seen `now`; past `most` entries, those older than `keep_s` go (the addresses of pods gone)."""
    seen[url] = now
    if len(seen) > most:
        for old in [u for u, at in seen.items() if now - at > keep_s]:
            del seen[old]
