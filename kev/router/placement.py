"""Placement over replicas: the router's strategy, breaker and spill, with partitions (or devices) as its channels.

The same kev.router.Router that binds questions to channels in one engine binds them here to
work partitions (distributed: one NATS subject per partition, one worker pulls each) or to
engine replicas (multi_gpu). Its PoolView is the partitions' load:
  queue_length(p)  questions waiting in p, not yet pulled by a worker (the breaker reads it)
  load(p)          waiting + pulled and not yet answered (the strategies balance it)
  can_take(p)      fewer than `room` wait in p, and a worker is alive for it
  is_idle(p)       nothing waits in p or runs from it, and a worker is alive for it: the router
                   prefers such a partition to a busy pick (work-conserving, as for channels)
`room` is router.channel_pool_size x max(1, router.channel_queue_depth): the questions one
worker's channel pool holds in single mode. When no partition of the question's group can take it,
router.overflow_policy applies, exactly as for a full channel pool.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kev.config.schema import RouterConfig
from kev.router.features import QuestionFeatures
from kev.router.router import Placement, Router
from kev.router.semantic import Encoder


@dataclass
class PartitionLoads:
    waiting: list[int]
    running: list[int]
    room: int
    live: set[int] | None = None  # partitions some worker pulls; None: not known yet (all count)
    overflow: int = 0  # waiting in the shared overflow queue (policy `queue`)
    # Per partition, the overflow queue last: placed by this router since it started, and placed but
    # not yet published. A poll cannot see what was unpublished when it began, nor what was placed
    # after; update() adds both on top of what JetStream said.
    placed: list[int] = field(default_factory=list)
    unpublished: list[int] = field(default_factory=list)
    # High-water marks since the router started: a backlog lasts milliseconds, a scrape can miss it, a peak cannot.
    peak_waiting: int = 0  # the most questions waiting in the partitions at once
    peak_overflow: int = 0  # the most in the overflow queue at once

    @classmethod
    def empty(cls, num_partitions: int, room: int) -> PartitionLoads:
        return cls([0] * num_partitions, [0] * num_partitions, room, placed=[0] * (num_partitions + 1),
                   unpublished=[0] * (num_partitions + 1))

    # --- PoolView ---------------------------------------------------------------
    def load(self, channel_id: int) -> int:
        return self.waiting[channel_id] + self.running[channel_id]

    def queue_length(self, channel_id: int) -> int:
        return self.waiting[channel_id]

    def can_take(self, channel_id: int) -> bool:
        return self.waiting[channel_id] < self.room and self.is_live(channel_id)

    def is_idle(self, channel_id: int) -> bool:
        return self.load(channel_id) == 0 and self.is_live(channel_id)

    def is_live(self, channel_id: int) -> bool:
        return self.live is None or channel_id in self.live

    # --- what the poller learns -------------------------------------------------
    def snapshot(self) -> tuple[list[int], list[int]]:
        """Taken when a poll begins."""
        return list(self.placed), list(self.unpublished)

    def update(self, waiting: list[int], running: list[int], overflow: int,
               since: tuple[list[int], list[int]] | None = None) -> None:
        """Fresh counts from JetStream, plus what the poll could not see (see `placed`).

        A question may be counted twice for one poll: that errs on the safe side (less room)."""
        placed, unpublished = since or (self.placed, [0] * len(self.placed))
        extra = [max(0, now - then) + late for now, then, late in zip(self.placed, placed, unpublished)]
        self.waiting = [w + e for w, e in zip(waiting, extra)]
        self.running, self.overflow = list(running), overflow + extra[-1]
        self._note_peaks()

    def count(self, partition: int | None, delta: int) -> None:
        """A question placed (delta 1) or withdrawn (-1): in `partition`, or the overflow queue (None)."""
        slot = len(self.waiting) if partition is None else partition
        self.placed[slot] += delta
        self.unpublished[slot] = max(0, self.unpublished[slot] + delta)
        if partition is None:
            self.overflow = max(0, self.overflow + delta)
        else:
            self.waiting[partition] = max(0, self.waiting[partition] + delta)
        self._note_peaks()

    def _note_peaks(self) -> None:
        self.peak_waiting = max(self.peak_waiting, sum(self.waiting))
        self.peak_overflow = max(self.peak_overflow, self.overflow)

    def published(self, partition: int | None) -> None:
        """JetStream has it: from now on a poll sees it."""
        slot = len(self.waiting) if partition is None else partition
        self.unpublished[slot] = max(0, self.unpublished[slot] - 1)

    @property
    def total_waiting(self) -> int:
        return sum(self.waiting) + self.overflow


@dataclass
class PartitionPlacer:
    """Binds questions to partitions. Each placement counts at once, so a burst sees its own questions
    before the next poll; a refused request takes its placements back with unplace()."""

    router: Router
    loads: PartitionLoads
    max_queue: int

    @classmethod
    def build(cls, config: RouterConfig, num_partitions: int, encoder: Encoder | None) -> PartitionPlacer:
        # The layout splits partitions (not channels) into the category x tier groups; every partition
        # works at once, so the groups' slot shares never bind here.
        sized = config.model_copy(update={"channel_pool_size": num_partitions, "max_parallel_queries": num_partitions})
        room = config.channel_pool_size * max(1, config.channel_queue_depth)
        return cls(Router(sized, encoder), PartitionLoads.empty(num_partitions, room), config.max_queue)

    def place(self, features: QuestionFeatures) -> Placement | None:
        placement = self.router.route(features, self.loads)
        if placement is not None:
            self.loads.count(placement.channel_id, 1)
        return placement

    def defer(self) -> bool:
        """Policy `queue`: into the shared overflow queue, if it holds fewer than router.max_queue."""
        if self.loads.overflow >= self.max_queue:
            return False
        self.loads.count(None, 1)
        return True

    def unplace(self, partitions: list[int | None]) -> None:
        """Withdraw placements of a refused request (None: one in the overflow queue)."""
        for partition in partitions:
            self.loads.count(partition, -1)
