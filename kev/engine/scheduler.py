"""Scheduler: which channels take part in the next step, and with which tokens.

Questions are bound to a channel when they arrive (the router picks it, an idle one when its
group has one) and wait in that channel's queue; each step an idle channel starts its queue
head, highest priority first across channels, within max_parallel and its group's share of
the slots. Placement stays work-conserving: a question waiting behind a busy channel moves
to a channel of its group that has fallen idle (rerouted: true) instead of waiting beside it.

Decode tokens go first (one per channel), then prefill chunks in admission order
while the step's token budget lasts. A chunk always ends at a multiple of
prefill_chunk counted from the question's own start, so how a prompt is cut never
depends on what else is running (batch invariance).
"""
from __future__ import annotations

import bisect
import time
from collections import Counter
from dataclasses import dataclass
from itertools import count

from kev.engine.channel_pool import ChannelPool, queue_order
from kev.engine.prefix_jobs import PrefixJobs
from kev.engine.question import Phase, Question
from kev.isolation.block_manager import BlockManager
from kev.router.layout import ChannelGroup
from kev.router.router import Router


@dataclass
class Work:
    question: Question
    start: int  # first position computed this step
    length: int  # tokens computed this step
    samples: bool  # does this step produce the question's next token?


@dataclass(frozen=True)
class SchedulerLimits:
    max_parallel: int
    max_step_tokens: int
    prefill_chunk: int
    max_context: int
    reserve_per_channel: bool  # unified KV: each channel holds max_context blocks for life
    max_queue: int = 0  # overflow FIFO of policy `queue`: questions no channel could take yet


class Scheduler:
    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, pool: ChannelPool, prefixes: PrefixJobs,
                 router: Router) -> None:
        self.limits, self.blocks, self.pool, self.prefixes, self.router = limits, blocks, pool, prefixes, router
        self.running: list[Question] = []
        self.overflow: list[Question] = []  # (-priority, arrival) order; bound to no channel yet
        self.shadows: list[Question] = []  # isolation re-runs: they run alone, when nothing else waits
        self._arrival = count()
        self.request_parallel: dict[str, int] = {}  # request_id -> its max_parallel cap

    def add(self, question: Question) -> bool:
        """Bind the question to a channel queue; False when no channel of its group can take it."""
        self._arrive(question)
        if question.shadow_of is not None:
            self.shadows.append(question)
            return True
        if question.features is None:  # built outside submit(): describe it from its text here
            text = question.normalized_text or question.original_text or ""
            question.features = self.router.describe(text, len(question.prompt_ids))
        placement = self.router.route(question.features, self.pool)
        if placement is None:
            return False
        question.rerouted = placement.rerouted
        self.pool.enqueue(placement.channel_id, question)
        return True

    def defer(self, question: Question, bounded: bool = True) -> bool:
        """Hold the question in the overflow FIFO; bounded (policy `queue`): False when max_queue are held.
        Policy `wait` does not bound it: each question there has a caller blocked in submit()."""
        if bounded and len(self.overflow) >= self.limits.max_queue:
            return False
        self._arrive(question)
        self.overflow.insert(bisect.bisect(self.overflow, queue_order(question), key=queue_order), question)
        return True

    def _arrive(self, question: Question) -> None:
        if question.arrival is None:  # first time here (the overflow FIFO drains through add())
            question.arrival = next(self._arrival)
            if question.prefix_ids:
                self.prefixes.register(question)

    def waiting(self) -> list[Question]:
        """Every question not running yet: in a channel queue or in the overflow FIFO (shadows aside)."""
        return self.pool.queued() + self.overflow

    def has_work(self) -> bool:
        return bool(self.running or self.overflow or self.pool.num_queued() or self.shadows or self.prefixes.jobs)

    def schedule(self) -> list[Work]:
        self._admit()
        decode = [Work(q, q.num_computed, 1, True) for q in self.running if q.phase is Phase.DECODE]
        budget = self.limits.max_step_tokens - len(decode)
        prefill: list[Work] = []
        for q in [job for job, _ in self.prefixes.jobs] + self.running:
            if q.phase is not Phase.PREFILL:
                continue
            chunk, origin = self.limits.prefill_chunk, q.prefix_len  # chunks restart after an attached prefix
            end = min(origin + ((q.num_computed - origin) // chunk + 1) * chunk, len(q.prompt_ids))
            length = end - q.num_computed
            if length > budget and (decode or prefill):
                break  # FIFO: a later prompt never overtakes an earlier one
            prefill.append(Work(q, q.num_computed, length, end == len(q.prompt_ids) and q.index >= 0))
            budget -= length
        work = decode + prefill
        for w in work:
            self.blocks.ensure(w.question.channel_id, w.start + w.length)  # type: ignore[arg-type]
        return work

    def finish(self, question: Question, reason: str, status: str = "ok", error: str | None = None) -> None:
        """Stop a question wherever it is; frees its channel (and, in split mode, its blocks)."""
        if question.is_finished:
            return
        question.phase, question.finish_reason, question.status, question.error = Phase.FINISHED, reason, status, error
        question.finished_at, question.finished_mono = time.time(), time.monotonic()
        if question in self.running:
            self.running.remove(question)
            if not self.limits.reserve_per_channel:
                self.blocks.release(question.channel_id)  # type: ignore[arg-type]
            self.pool.release(question.channel_id)  # type: ignore[arg-type]
        else:
            if not self.pool.remove(question):
                for held in (self.overflow, self.shadows):
                    if question in held:
                        held.remove(question)
            self.prefixes.forget(question)

    def _admit(self) -> None:
        if any(q.shadow_of is not None for q in self.running):
            return  # a shadow re-run is alone in the engine
        self._drain_overflow()
        if self.shadows and not self.running and not self.waiting():
            self._start_shadow()
            return
        self._move_to_idle()
        per_request = Counter(q.request_id for q in self.running)
        per_group = Counter(self._group(q).name for q in self.running)
        for q in sorted(self.pool.ready(), key=queue_order):
            if len(self.running) >= self.limits.max_parallel:
                break
            group, cap = self._group(q), self.request_parallel.get(q.request_id, self.limits.max_parallel)
            if per_group[group.name] >= group.slots or per_request[q.request_id] >= cap:
                continue
            if not self.prefixes.is_ready(q) or not self._fits(q):
                continue
            self._start(q)
            per_request[q.request_id] += 1
            per_group[group.name] += 1
        self._drain_overflow()  # the queue heads that started left room

    def _move_to_idle(self) -> None:
        """Questions queued behind a busy channel go to idle channels of their group, first in queue order."""
        if not any(self.pool.is_idle(c.channel_id) for c in self.pool.channels):
            return
        for q in sorted(self.pool.queued(), key=queue_order):
            channel = self.pool.channels[q.channel_id]  # type: ignore[index]
            if channel.question is None and channel.queue[0] is q:
                continue  # it starts where it is
            if any(self.pool.is_idle(c) for c in self._group(q).channels):  # the strategy picks which one
                self.pool.move(q, self.router.route(q.features, self.pool).channel_id)  # type: ignore[arg-type,union-attr]
                q.rerouted = True

    def _start(self, q: Question) -> None:
        self.pool.start(q)
        if not self.limits.reserve_per_channel:
            self.blocks.promise(q.channel_id, self._max_tokens(q))  # type: ignore[arg-type]
        if q.prefix is not None:
            self.prefixes.attach(q)
        q.phase, q.started_at, q.started_mono = Phase.PREFILL, time.time(), time.monotonic()
        self.running.append(q)

    def _start_shadow(self) -> None:
        """The engine is idle: the oldest shadow re-run takes its original's channel, alone."""
        q = self.shadows[0]
        if self.prefixes.is_ready(q) and self._fits(q):
            self.shadows.pop(0)
            self.pool.enqueue(q.shadow_of.channel_id or 0, q)  # type: ignore[union-attr]
            self._start(q)

    def _group(self, q: Question) -> ChannelGroup:
        return self.router.layout.group_of(q.channel_id)  # type: ignore[arg-type]

    def _drain_overflow(self) -> None:
        """Route the overflow FIFO into channels with room, in order (a full group keeps its place)."""
        self.overflow = [q for q in self.overflow if not self.add(q)]

    def _max_tokens(self, q: Question) -> int:
        return min(len(q.prompt_ids) + q.sampling.max_tokens, self.limits.max_context)

    def _fits(self, q: Question) -> bool:
        if self.limits.reserve_per_channel or self.blocks.can_promise(self._max_tokens(q)):
            return True
        # Idle cached prefixes (loose) give way to live questions.
        return self.prefixes.store.evict(self.blocks.blocks_for(self._max_tokens(q))) and self.blocks.can_promise(self._max_tokens(q))
