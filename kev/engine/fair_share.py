"""FairShare: in what order waiting questions take parallel slots and queue places (the scheduler asks it).

Two classes, live before batch (SharingConfig): a batch line never starts while a live question waits for a slot,
holds at most sharing.batch_share of the slots while live work is there, and leaves sharing.batch_reserve slots free
even when it is not (a live question arriving starts at once, instead of after some batch answer ends).

Among tenants of one class, start-time fair queueing (Goyal et al., 1996): each tenant has a virtual time that
grows by 1/weight per question it starts; the waiting tenant with the smallest goes first, and a tenant that was idle
starts from the system's virtual time (the tag of the last question started), so idling banks no credit. Within a
tenant, the order is the queue's: priority, then arrival. A caller's priority therefore orders its own questions
only: no priority lets one tenant overtake another's share.

It changes when a question starts, never what it computes: the channel, chunks and rows of a question are the same
whenever it starts (batch invariance), so answers stay bit-identical and the isolation levels are untouched.
"""
from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Iterable

from kev.config.sharing_config import SharingConfig
from kev.engine.channel_pool import queue_order
from kev.engine.question import Question


class FairShare:
    def __init__(self, sharing: SharingConfig | None = None, max_parallel: int = 1, max_queue: int = 0) -> None:
        self.sharing = sharing or SharingConfig()
        self.max_parallel, self.max_queue = max_parallel, max_queue
        self._vtime: dict[str, float] = {}  # tenant -> virtual time after its last start
        self._now = 0.0  # the system's virtual time: the start tag of the last question started
        self.tenants_seen: set[str] = set()

    # --- order ----------------------------------------------------------------------
    def order(self, questions: Iterable[Question]) -> list[Question]:
        """Live first, then batch; within a class, tenants interleaved by weighted virtual time (as if each went
        on to start); within a tenant, queue order."""
        by_class: dict[int, dict[str, list[Question]]] = defaultdict(lambda: defaultdict(list))
        for q in sorted(questions, key=queue_order):
            by_class[is_batch(q)][q.tenant].append(q)
        ordered: list[Question] = []
        for rank in sorted(by_class):
            tenants = by_class[rank]
            heap = [(self._start_tag(t), queue_order(qs[0])[1:], t) for t, qs in tenants.items()]
            heapq.heapify(heap)
            taken: Counter[str] = Counter()
            while heap:
                tag, _, tenant = heapq.heappop(heap)
                waiting = tenants[tenant]
                ordered.append(waiting[taken[tenant]])
                taken[tenant] += 1
                if taken[tenant] < len(waiting):
                    nxt = waiting[taken[tenant]]
                    heapq.heappush(heap, (tag + 1 / self.sharing.weight(tenant), queue_order(nxt)[1:], tenant))
        return ordered

    def _start_tag(self, tenant: str) -> float:
        return max(self._vtime.get(tenant, 0.0), self._now)

    def started(self, q: Question) -> None:
        """q took a slot: its tenant's virtual time moves on by 1/weight."""
        tag = self._start_tag(q.tenant)
        self._now = tag
        self._vtime[q.tenant] = tag + 1 / self.sharing.weight(q.tenant)

    # --- classes --------------------------------------------------------------------
    def batch_cap(self, live_present: bool) -> int:
        """Slots batch lines may hold: batch_share of them while live work is there, else all but batch_reserve."""
        if live_present:
            return math.ceil(self.sharing.batch_share * self.max_parallel)
        return max(1, self.max_parallel - self.sharing.batch_reserve)

    # --- queue places ---------------------------------------------------------------
    def queue_room(self, tenant: str, held: list[Question]) -> bool:
        """May the tenant put one more question in the overflow FIFO? Its share of router.max_queue: sharing.
        tenant_max_queue, else max_queue x its weight over that of every tenant seen so far."""
        self.tenants_seen.add(tenant)
        cap = self.sharing.tenant_limit(self.sharing.tenant_max_queue, self.max_queue, tenant,
                                        sorted(self.tenants_seen))
        return sum(1 for q in held if q.tenant == tenant) < cap


def is_batch(q: Question) -> int:
    return 1 if q.work_class == "batch" else 0
