"""The `wait` handshake: a submit() blocked by router.overflow_policy `wait` sleeps until the step loop has bound
its questions to channels (or they were cancelled).

Each blocked caller waits on a condition of its own (of the engine's lock), woken only once all its questions are
bound, so a step never wakes every blocked caller at once."""
from __future__ import annotations

import threading

from kev.engine.question import Question


class BindWaiters:
    def __init__(self, mutex: threading.RLock) -> None:
        self._mutex = mutex
        self._waiting: list[tuple[list[Question], threading.Condition]] = []

    def wait(self, questions: list[Question], seconds: float | None) -> None:
        """Engine lock held (released while asleep): until woken by wake_bound() or `seconds` passed."""
        waiter = threading.Condition(self._mutex)
        self._waiting.append((questions, waiter))
        try:
            waiter.wait(seconds)
        finally:
            self._waiting = [(qs, w) for qs, w in self._waiting if w is not waiter]

    def wake_bound(self) -> None:
        """Engine lock held: wake the callers whose questions all have a channel now (or were cancelled)."""
        for questions, waiter in self._waiting:
            if all(q.channel_id is not None or q.is_finished for q in questions):
                waiter.notify()
