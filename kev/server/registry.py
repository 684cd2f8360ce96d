"""The requests this server has submitted: how many are in flight, and which finished ones to forget.

Only the event loop touches it, so it needs no lock.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kev.backend.watch import Watch


@dataclass
class Tracked:
    request_id: str
    watch: Watch
    retained: bool  # async requests stay readable after they finish; others go when answered
    tenant: str = "default"  # whose: another tenant's GET / DELETE is a 404
    cancelled: bool = False

    @property
    def is_done(self) -> bool:
        return self.watch.done.is_set()


TenantCap = Callable[[str], int]  # tenant -> its share of a global limit (sharing.tenant_*)


class RequestRegistry:
    def __init__(self, max_inflight: int, ttl_s: float, max_retained: int, tenant_inflight: TenantCap | None = None,
                 tenant_retained: TenantCap | None = None) -> None:
        """tenant_inflight / tenant_retained: each tenant's share of max_inflight / max_retained (None: the whole)."""
        self.max_inflight, self.ttl_s, self.max_retained = max_inflight, ttl_s, max_retained
        self.tenant_inflight = tenant_inflight or (lambda _: max_inflight)
        self.tenant_retained = tenant_retained or (lambda _: max_retained)
        self._requests: dict[str, Tracked] = {}  # insertion order = submission order
        self._reserved: Counter[str] = Counter()  # per tenant: slots taken by submissions still inside engine.submit

    @property
    def num_inflight(self) -> int:
        return sum(self._reserved.values()) + sum(1 for t in self._requests.values() if not t.is_done)

    def inflight_of(self, tenant: str) -> int:
        return self._reserved[tenant] + sum(1 for t in self._requests.values() if not t.is_done and t.tenant == tenant)

    def full(self, tenant: str = "default") -> str | None:
        """The in-flight limit a new request of the tenant would pass (the server's, or the tenant's share of it:
        one tenant holding its whole share leaves the others theirs); None: there is room."""
        if self.num_inflight >= self.max_inflight:
            return f"server.max_inflight_requests={self.max_inflight}"
        if self.inflight_of(tenant) >= (cap := self.tenant_inflight(tenant)):
            return f"tenant {tenant!r}'s share of it, {cap} (sharing.tenant_max_inflight_requests)"
        return None

    def reserve(self, tenant: str = "default") -> bool:
        """Take an in-flight slot before submitting; False when the server, or the tenant's share, is full."""
        if self.full(tenant) is not None:
            return False
        self._reserved[tenant] += 1
        return True

    def unreserve(self, tenant: str = "default") -> None:
        self._reserved[tenant] -= 1

    def add(self, tracked: Tracked) -> None:
        self._requests[tracked.request_id] = tracked

    def get(self, request_id: str) -> Tracked | None:
        return self._requests.get(request_id)

    def remove(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def owner(self, request_id: str) -> str | None:
        """The tenant whose request it is (None: not one of this server's, e.g. a batch line's)."""
        tracked = self._requests.get(request_id)
        return tracked.tenant if tracked is not None else None

    def unfinished(self) -> list[str]:
        return [rid for rid, t in self._requests.items() if not t.is_done]

    def expired(self, now: float | None = None) -> list[str]:
        """Finished requests past their time-to-live, plus the oldest retained ones beyond a tenant's share of
        max_retained, then beyond max_retained itself (taken from the tenants holding the most): one tenant's many
        async requests never push out another's results."""
        now = time.monotonic() if now is None else now
        finished = [t for t in self._requests.values() if t.is_done]
        old = {t.request_id for t in finished if now - (t.watch.finished_at or now) > self.ttl_s}
        retained = [t for t in finished if t.retained and t.request_id not in old]
        by_tenant: dict[str, list[Tracked]] = {}
        for t in retained:
            by_tenant.setdefault(t.tenant, []).append(t)
        for tenant, held in by_tenant.items():
            excess = max(0, len(held) - self.tenant_retained(tenant))
            old.update(t.request_id for t in held[:excess])
            del held[:excess]
        while sum(len(held) for held in by_tenant.values()) > self.max_retained:
            old.add(max(by_tenant.values(), key=len).pop(0).request_id)
        return [rid for rid in self._requests if rid in old]
