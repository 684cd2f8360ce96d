"""ChannelPool: channel_pool_size pre-created channels, reused like database connections."""
from __future__ import annotations

from dataclasses import dataclass

from kev.engine.question import Question


@dataclass
class ChannelState:
    channel_id: int
    question: Question | None = None
    num_served: int = 0


class ChannelPool:
    def __init__(self, size: int) -> None:
        self.channels = [ChannelState(i) for i in range(size)]
        self._next = 0  # round-robin cursor, so consecutive questions land in different channels

    @property
    def size(self) -> int:
        return len(self.channels)

    def num_free(self) -> int:
        return sum(1 for c in self.channels if c.question is None)

    def is_free(self, channel_id: int) -> bool:
        return self.channels[channel_id].question is None

    def acquire(self, question: Question, preferred: int | None = None) -> int | None:
        """Bind the question to `preferred` if free, else to the next free channel round-robin."""
        if preferred is not None and self.is_free(preferred):
            chosen = preferred
        else:
            order = [(self._next + i) % self.size for i in range(self.size)]
            chosen = next((c for c in order if self.is_free(c)), None)
            if chosen is None:
                return None
            self._next = (chosen + 1) % self.size
        self.channels[chosen].question = question
        self.channels[chosen].num_served += 1
        return chosen

    def release(self, channel_id: int) -> None:
        self.channels[channel_id].question = None
