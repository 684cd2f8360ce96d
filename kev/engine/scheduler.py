"""Scheduler: which channels take part in the next step, and with which tokens.

Decode tokens go first (one per channel), then prefill chunks in admission order
while the step's token budget lasts. A chunk always ends at a multiple of
prefill_chunk counted from the question's own start, so how a prompt is cut never
depends on what else is running (batch invariance).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import count

from kev.engine.channel_pool import ChannelPool
from kev.engine.prefix_jobs import PrefixJobs
from kev.engine.question import Phase, Question
from kev.isolation.block_manager import BlockManager


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


class Scheduler:
    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, pool: ChannelPool, prefixes: PrefixJobs) -> None:
        self.limits, self.blocks, self.pool, self.prefixes = limits, blocks, pool, prefixes
        self.waiting: list[tuple[int, int, Question]] = []  # (-priority, arrival, question)
        self.running: list[Question] = []
        self._arrival = count()
        self.request_parallel: dict[str, int] = {}  # request_id -> its max_parallel cap

    def add(self, question: Question) -> None:
        if question.prefix_ids:
            self.prefixes.register(question)
        self.waiting.append((-question.priority, next(self._arrival), question))
        self.waiting.sort(key=lambda item: item[:2])

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.prefixes.jobs)

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
            self.waiting = [item for item in self.waiting if item[2] is not question]
            self.prefixes.forget(question)

    def _admit(self) -> None:
        if any(q.shadow_of is not None for q in self.running):
            return  # a shadow re-run is alone in the engine
        busy = bool(self.running) or any(item[2].shadow_of is None for item in self.waiting)
        running_per_request: dict[str, int] = {}
        for q in self.running:
            running_per_request[q.request_id] = running_per_request.get(q.request_id, 0) + 1
        kept: list[tuple[int, int, Question]] = []
        for item in self.waiting:
            q = item[2]
            if q.shadow_of is not None and (busy or self.running):  # shadows run only when the engine is idle
                kept.append(item)
                continue
            cap = self.request_parallel.get(q.request_id, self.limits.max_parallel)
            ready = (len(self.running) < self.limits.max_parallel and self.prefixes.is_ready(q)
                     and running_per_request.get(q.request_id, 0) < cap and self._fits(q))
            channel = self.pool.acquire(q) if ready else None
            if channel is None:
                kept.append(item)
                continue
            q.channel_id = channel
            if not self.limits.reserve_per_channel:
                self.blocks.promise(q.channel_id, self._max_tokens(q))
            if q.prefix is not None:
                self.prefixes.attach(q)
            q.phase, q.started_at, q.started_mono = Phase.PREFILL, time.time(), time.monotonic()
            self.running.append(q)
            running_per_request[q.request_id] = running_per_request.get(q.request_id, 0) + 1
        self.waiting = kept

    def _max_tokens(self, q: Question) -> int:
        return min(len(q.prompt_ids) + q.sampling.max_tokens, self.limits.max_context)

    def _fits(self, q: Question) -> bool:
        if self.limits.reserve_per_channel or self.blocks.can_promise(self._max_tokens(q)):
            return True
        # Idle cached prefixes (loose) give way to live questions.
        return self.prefixes.store.evict(self.blocks.blocks_for(self._max_tokens(q))) and self.blocks.can_promise(self._max_tokens(q))
