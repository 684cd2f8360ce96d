"""Scheduler: which channels take part in the next step, and with which tokens.

Questions are bound to a channel when they arrive (the router picks it) and wait in that
channel's queue; each step an idle channel starts its queue head, highest priority first
across channels, within max_parallel and its group's share of the slots.

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
    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, pool: ChannelPool, router: Router) -> None:
        self.limits, self.blocks, self.pool, self.router = limits, blocks, pool, router
        self.running: list[Question] = []
        self.overflow: list[Question] = []  # (-priority, arrival) order; bound to no channel yet
        self._arrival = count()
        self.request_parallel: dict[str, int] = {}  # request_id -> its max_parallel cap

    def add(self, question: Question) -> bool:
        """Bind the question to a channel queue; False when no channel of its group can take it."""
        if question.arrival is None:
            question.arrival = next(self._arrival)
        if question.features is None:  # built outside submit(): describe it from its text here
            text = question.normalized_text or question.original_text or ""
            question.features = self.router.describe(text, len(question.prompt_ids))
        placement = self.router.route(question.features, self.pool)
        if placement is None:
            return False
        question.rerouted = placement.rerouted
        self.pool.enqueue(placement.channel_id, question)
        return True

    def defer(self, question: Question) -> bool:
        """Overflow policy `queue`: hold the question in the bounded FIFO; False when it is full."""
        if len(self.overflow) >= self.limits.max_queue:
            return False
        self.overflow.insert(bisect.bisect(self.overflow, queue_order(question), key=queue_order), question)
        return True

    def waiting(self) -> list[Question]:
        """Every question not running yet: in a channel queue or in the overflow FIFO."""
        return self.pool.queued() + self.overflow

    def has_work(self) -> bool:
        return bool(self.running or self.overflow or self.pool.num_queued())

    def schedule(self) -> list[Work]:
        self._admit()
        decode = [Work(q, q.num_computed, 1, True) for q in self.running if q.phase is Phase.DECODE]
        budget = self.limits.max_step_tokens - len(decode)
        prefill: list[Work] = []
        for q in self.running:
            if q.phase is not Phase.PREFILL:
                continue
            end = min((q.num_computed // self.limits.prefill_chunk + 1) * self.limits.prefill_chunk, len(q.prompt_ids))
            length = end - q.num_computed
            if length > budget and (decode or prefill):
                break  # FIFO: a later prompt never overtakes an earlier one
            prefill.append(Work(q, q.num_computed, length, end == len(q.prompt_ids)))
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
        elif not self.pool.remove(question) and question in self.overflow:
            self.overflow.remove(question)

    def _admit(self) -> None:
        self._drain_overflow()
        per_request = Counter(q.request_id for q in self.running)
        per_group = Counter(self._group(q).name for q in self.running)
        for q in sorted(self.pool.ready(), key=queue_order):
            if len(self.running) >= self.limits.max_parallel:
                break
            group, cap = self._group(q), self.request_parallel.get(q.request_id, self.limits.max_parallel)
            if per_group[group.name] >= group.slots or per_request[q.request_id] >= cap or not self._fits(q):
                continue
            self._start(q)
            per_request[q.request_id] += 1
            per_group[group.name] += 1
        self._drain_overflow()  # the queue heads that started left room

    def _start(self, q: Question) -> None:
        self.pool.start(q)
        if not self.limits.reserve_per_channel:
            self.blocks.promise(q.channel_id, self._max_tokens(q))  # type: ignore[arg-type]
        q.phase, q.started_at, q.started_mono = Phase.PREFILL, time.time(), time.monotonic()
        self.running.append(q)

    def _group(self, q: Question) -> ChannelGroup:
        return self.router.layout.group_of(q.channel_id)  # type: ignore[arg-type]

    def _drain_overflow(self) -> None:
        """Route the overflow FIFO into channels with room, in order (a full group keeps its place)."""
        self.overflow = [q for q in self.overflow if not self.add(q)]

    def _max_tokens(self, q: Question) -> int:
        return min(len(q.prompt_ids) + q.sampling.max_tokens, self.limits.max_context)

    def _fits(self, q: Question) -> bool:
        return self.limits.reserve_per_channel or self.blocks.can_promise(self._max_tokens(q))
