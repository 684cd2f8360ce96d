"""Overflow: what submit() does when no channel can start a question (router.overflow_policy).

"Can take": an idle channel of the question's group (nothing running or waiting in it), or a
busy one with fewer than router.channel_queue_depth questions in its own queue (0, the
default: none). When no channel can:
  wait   — submit blocks (the engine lock released) until the step loop binds the question to
           a channel, in FIFO order (priority, then arrival), up to the question's timeout_ms
           (none by default), then raises OverflowTimeoutError (a TimeoutError);
  queue  — the question waits unbound in a FIFO of router.max_queue and submit returns at once;
           over it, RejectedError;
  reject — RejectedError at once.
A submit that raises leaves nothing behind: the questions it had already placed are withdrawn.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from kev.engine.question import Question
from kev.engine.scheduler import Scheduler
from kev.errors import OverflowTimeoutError, RejectedError

WaitForRoom = Callable[[list[Question], float | None], None]


def describe_load(scheduler: Scheduler) -> str:
    pool = scheduler.pool
    return (f"channel pool of {pool.size} channels: {len(scheduler.running)} running, {pool.num_queued()} queued "
            f"in channels (router.channel_queue_depth={pool.queue_depth}), {len(scheduler.overflow)} in overflow")


def place_all(scheduler: Scheduler, questions: list[Question], policy: str,
              wait_for_room: WaitForRoom) -> None:
    """Bind every question to a channel (or the overflow FIFO); with the engine lock held.

    The questions of one request arrive together, so the highest priority is placed first.
    wait_for_room(unbound questions, seconds or None) lets the engine run while a `wait` submit is blocked."""
    placed: list[Question] = []
    try:
        for q in sorted(questions, key=lambda q: -q.priority):  # stable: in index order within a priority
            placed.append(q)  # before placing: a refused question is withdrawn too (its prefix entry)
            _place(scheduler, q, policy)
        if policy == "wait":
            _wait_until_bound(scheduler, placed, wait_for_room)
    except (RejectedError, OverflowTimeoutError):
        for q in placed:
            scheduler.finish(q, "cancelled", "withdrawn: its request was not accepted")
        raise


def _place(scheduler: Scheduler, q: Question, policy: str) -> None:
    if not scheduler.overflow and scheduler.add(q):  # never ahead of questions already waiting
        return
    if policy == "reject":
        raise RejectedError(f"no channel can take question {q.index} (overflow_policy=reject); "
                            f"{describe_load(scheduler)}")
    if not scheduler.defer(q, bounded=policy == "queue"):
        raise RejectedError(f"overflow queue full (router.max_queue={scheduler.limits.max_queue}); "
                            f"{describe_load(scheduler)}")


def _wait_until_bound(scheduler: Scheduler, questions: list[Question], wait_for_room: WaitForRoom) -> None:
    """`wait`: the caller blocks until the step loop has bound each question (FIFO order), or one's timeout_ms
    passes (OverflowTimeoutError), or they are cancelled (the engine closes)."""
    started = time.monotonic()
    while unbound := [q for q in questions if q.channel_id is None and not q.is_finished]:
        budgets = [q.timeout_ms for q in unbound if q.timeout_ms is not None]
        remaining = None if not budgets else started + min(budgets) / 1000 - time.monotonic()
        if remaining is not None and remaining <= 0:
            q = min(unbound, key=lambda q: q.timeout_ms if q.timeout_ms is not None else float("inf"))
            raise OverflowTimeoutError(f"no channel could take question {q.index} within its timeout_ms "
                                       f"({q.timeout_ms}, overflow_policy=wait); {describe_load(scheduler)}")
        wait_for_room(unbound, remaining)
