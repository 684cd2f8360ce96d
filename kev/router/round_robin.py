"""round_robin: channels in turn, whatever the question. Even counts, blind to length and load."""
from __future__ import annotations

from collections.abc import Sequence

from kev.router.features import PoolView, QuestionFeatures


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn: dict[tuple[int, ...], int] = {}  # per channel group

    def choose(self, features: QuestionFeatures, channels: Sequence[int], view: PoolView) -> int:
        key = tuple(channels)
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        return channels[turn % len(channels)]
