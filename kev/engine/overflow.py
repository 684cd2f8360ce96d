"""Overflow: what submit() does when no channel can take a question (router.overflow_policy).

"Can take": a channel can take a question while fewer than router.channel_queue_depth
questions wait in its own queue; the router tries the strategy's pick, then the
least-loaded channel of the question's group. When none can:
  wait   — submit blocks (the engine lock released) until a channel has room, up to the
           question's own timeout_ms, then raises OverflowTimeoutError (a TimeoutError);
  queue  — the question waits unbound in a FIFO of router.max_queue; over it, RejectedError;
  reject — RejectedError at once.
A submit that raises leaves nothing behind: the questions it had already placed are withdrawn.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from kev.engine.question import Question
from kev.engine.scheduler import Scheduler
from kev.errors import OverflowTimeoutError, RejectedError


def describe_load(scheduler: Scheduler) -> str:
    pool = scheduler.pool
    return (f"channel pool of {pool.size} channels: {len(scheduler.running)} running, {pool.num_queued()} queued "
            f"in channel queues (router.channel_queue_depth={pool.queue_depth}), {len(scheduler.overflow)} in overflow")


def place_all(scheduler: Scheduler, questions: list[Question], policy: str,
              wait_for_room: Callable[[float], None]) -> None:
    """Bind every question to a channel (or the overflow FIFO); with the engine lock held.

    wait_for_room(seconds) lets the engine run while a `wait` submit is blocked."""
    placed: list[Question] = []
    try:
        for q in questions:
            placed.append(q)  # before placing: a refused question is withdrawn too (its prefix entry)
            _place(scheduler, q, policy, wait_for_room)
    except (RejectedError, OverflowTimeoutError):
        for q in placed:
            scheduler.finish(q, "cancelled", "cancelled", "withdrawn: its request was not accepted")
        raise


def _place(scheduler: Scheduler, q: Question, policy: str, wait_for_room: Callable[[float], None]) -> None:
    deadline = time.monotonic() + q.timeout_ms / 1000
    while not scheduler.add(q):
        if policy == "queue":
            if scheduler.defer(q):
                return
            raise RejectedError(f"overflow queue full (router.max_queue={scheduler.limits.max_queue}); "
                                f"{describe_load(scheduler)}")
        if policy == "reject":
            raise RejectedError(f"no channel can take question {q.index} (overflow_policy=reject); {describe_load(scheduler)}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OverflowTimeoutError(f"no channel could take question {q.index} within its timeout_ms "
                                       f"({q.timeout_ms}, overflow_policy=wait); {describe_load(scheduler)}")
        wait_for_room(remaining)
