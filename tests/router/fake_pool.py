"""A PoolView over plain counters, for router tests without an engine."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class FakePool:
    size: int
    queue_depth: int = 1_000_000
    queued: Counter[int] = field(default_factory=Counter)
    running: set[int] = field(default_factory=set)

    def load(self, channel_id: int) -> int:
        return self.queued[channel_id] + (channel_id in self.running)

    def queue_length(self, channel_id: int) -> int:
        return self.queued[channel_id]

    def can_take(self, channel_id: int) -> bool:
        return self.is_idle(channel_id) or self.queued[channel_id] < self.queue_depth

    def is_idle(self, channel_id: int) -> bool:
        return self.load(channel_id) == 0

    @classmethod
    def busy(cls, size: int, **kwargs: object) -> FakePool:
        """Every channel runs a question: what a strategy prefers shows, nothing is idle to take it."""
        return cls(size, running=set(range(size)), **kwargs)  # type: ignore[arg-type]

    def loads(self) -> list[int]:
        return [self.load(c) for c in range(self.size)]
