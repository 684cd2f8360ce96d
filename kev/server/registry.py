"""The requests this server has submitted: how many are in flight, and which finished ones to forget.

Only the event loop touches it, so it needs no lock.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from kev.server.watch import Watch


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


class RequestRegistry:
    def __init__(self, max_inflight: int, ttl_s: float, max_retained: int) -> None:
        self.max_inflight, self.ttl_s, self.max_retained = max_inflight, ttl_s, max_retained
        self._requests: dict[str, Tracked] = {}  # insertion order = submission order
        self._reserved = 0  # slots taken by submissions still inside engine.submit

    @property
    def num_inflight(self) -> int:
        return self._reserved + sum(1 for t in self._requests.values() if not t.is_done)

    def reserve(self) -> bool:
        """Take an in-flight slot before submitting; False when the server is full."""
        if self.num_inflight >= self.max_inflight:
            return False
        self._reserved += 1
        return True

    def unreserve(self) -> None:
        self._reserved -= 1

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
        """Finished requests past their time-to-live, plus the oldest retained ones beyond max_retained."""
        now = time.monotonic() if now is None else now
        finished = [t for t in self._requests.values() if t.is_done]
        old = {t.request_id for t in finished if now - (t.watch.finished_at or now) > self.ttl_s}
        retained = [t.request_id for t in finished if t.retained and t.request_id not in old]
        old.update(retained[:max(0, len(retained) - self.max_retained)])
        return [rid for rid in self._requests if rid in old]
