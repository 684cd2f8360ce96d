"""What the router knows about a question and about the pool, and the one interface every strategy has."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class QuestionFeatures:
    num_tokens: int  # prompt length in tokens, chat template included
    bucket: int  # SimHash bucket of the normalized text, in [0, router.num_buckets)
    category: str = "other"  # the first router.categories entry that matched


class PoolView(Protocol):
    """Read-only load of the channel pool. A channel's load is its running question plus its queue."""

    def load(self, channel_id: int) -> int: ...

    def queue_length(self, channel_id: int) -> int: ...

    def can_take(self, channel_id: int) -> bool: ...

    def is_idle(self, channel_id: int) -> bool:
        """Nothing runs in the channel and nothing waits for it: a question placed there starts at the next step."""
        ...


class Strategy(Protocol):
    name: str

    def choose(self, features: QuestionFeatures, channels: Sequence[int], view: PoolView) -> int:
        """One of `channels` (the question's channel group, never empty) for this question."""
        ...


def next_idle(channels: Sequence[int], chosen: int, view: PoolView) -> int | None:
    """`chosen` if it is idle, else the first idle channel after it in the group's order (wrapping); None: all busy."""
    n, start = len(channels), channels.index(chosen)
    return next((channels[(start + i) % n] for i in range(n) if view.is_idle(channels[(start + i) % n])), None)


def least_loaded(channels: Sequence[int], view: PoolView, start: int = 0) -> int:
    """The channel with the smallest load; ties go to the first one at or after position `start`."""
    n = len(channels)
    return min((channels[(start + i) % n] for i in range(n)), key=view.load)
