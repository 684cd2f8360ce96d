"""ConnectionBook: which connections are open, from where, and which have yet to send a whole request.

Slow or idle sockets must not starve real clients (a flood of sockets that trickle their headers once
filled server.max_connections and every real client got 503). Three rules, all decided here:
  - one client address holds at most server.max_connections_per_client connections; one more is refused (503)
    unless its first bytes are a whole request's headers: then it takes the place of that address's longest waiting
    connection (evicted: 408), so tricklers behind one NAT or proxy never lock out the complete requests beside them
    (1,000 from one address once did); addresses in server.forwarded_allow_ips (trusted proxies) have no such cap
    on their own address, but each request through one counts, from its headers until it is answered, against the
    address its X-Forwarded-For names (begin_forwarded: one over the cap is a 503);
  - connections that have not yet sent a whole request may hold at most max_connections minus
    server.connection_reserve slots: when they hold them all, a new connection evicts the one that has
    waited longest (it gets its 408), so a real client, whose request arrives at once, always finds a slot;
  - the header and body deadlines tighten as the server fills: the full deadline up to half full, then
    shrinking linearly to a tenth of it when full.
The protocol (kev.server.slow_clients) calls admit / sent_request / close; all of it runs on the event loop.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Protocol

MIN_DEADLINE_SHARE = 0.1  # the share of a deadline left when the server is full


class Evictable(Protocol):
    def evict(self) -> None:
        """Answer 408 (the server needs the slot) and close."""


@dataclass
class ConnectionBook:
    max_connections: int
    max_per_client: int
    reserve: int  # slots only connections that have sent a whole request may use
    clients: dict[Evictable, str] = field(default_factory=dict)  # every open connection -> its client address
    per_client: Counter[str] = field(default_factory=Counter)
    waiting: OrderedDict[Evictable, None] = field(default_factory=OrderedDict)  # no whole request yet; oldest first
    # trusted proxies (server.forwarded_allow_ips, as uvicorn reads it: addresses, networks, "*"): no cap of their own
    proxies: Container[str] = frozenset()
    num_evicted: int = 0
    num_refused: int = 0

    def admit(self, connection: Evictable, client: str) -> str | None:
        """None when the connection may stay (it is then booked); otherwise why it is refused (a 503)."""
        if self.is_over_cap(client):
            self.num_refused += 1
            return (f"{self.per_client[client]} connections from {client} are open; the limit is "
                    f"server.max_connections_per_client={self.max_per_client}")
        if len(self.waiting) >= self.max_connections - self.reserve:
            self._evict_oldest()
        if len(self.clients) >= self.max_connections:
            self.num_refused += 1
            return (f"{len(self.clients)} connections are open; the limit is "
                    f"server.max_connections={self.max_connections}")
        self.clients[connection] = client
        self.per_client[client] += 1
        self.waiting[connection] = None
        return None

    def is_over_cap(self, client: str) -> bool:
        return self.per_client[client] >= self.max_per_client and client not in self.proxies

    def admit_complete(self, connection: Evictable, client: str) -> str | None:
        """A connection refused for its address's cap has sent a whole request's headers: it takes the place of the
        address's longest waiting connection (evicted), booked as having sent its request. None: admitted."""
        oldest = next((waiting for waiting in self.waiting if self.clients[waiting] == client), None)
        if oldest is None:
            return (f"{self.per_client[client]} connections from {client} are open, each with a request; the limit "
                    f"is server.max_connections_per_client={self.max_per_client}")
        self._evict(oldest)
        self.num_refused -= 1  # counted when it was first refused
        self.clients[connection] = client
        self.per_client[client] += 1
        return None

    def begin_forwarded(self, client: str, proxy: str) -> str | None:
        """A request through trusted proxy `proxy` has its headers in, and X-Forwarded-For names `client`: it counts
        against client's cap until end_forwarded (None), or is refused now (why: a 503)."""
        if self.is_over_cap(client):
            self.num_refused += 1
            return (f"{self.per_client[client]} connections and requests from {client} (X-Forwarded-For, through "
                    f"{proxy}) are open; the limit is server.max_connections_per_client={self.max_per_client}")
        self.per_client[client] += 1
        return None

    def end_forwarded(self, client: str) -> None:
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]

    def sent_request(self, connection: Evictable) -> None:
        """It sent a whole request: from now on it may use the reserve, and is never evicted."""
        self.waiting.pop(connection, None)

    def close(self, connection: Evictable) -> None:
        self.waiting.pop(connection, None)
        client = self.clients.pop(connection, None)
        if client is not None:
            self.per_client[client] -= 1
            if self.per_client[client] <= 0:
                del self.per_client[client]

    def deadline(self, full_s: float) -> float:
        """full_s as the server's fill allows: all of it up to half full, a tenth of it when full."""
        fill = len(self.clients) / self.max_connections
        share = 1.0 if fill <= 0.5 else max(MIN_DEADLINE_SHARE, 1.0 - (fill - 0.5) * 2 * (1 - MIN_DEADLINE_SHARE))
        return full_s * share

    def _evict_oldest(self) -> None:
        self._evict(next(iter(self.waiting)))

    def _evict(self, oldest: Evictable) -> None:
        self.close(oldest)  # its slot is free now, not when its socket has closed
        self.num_evicted += 1
        oldest.evict()
