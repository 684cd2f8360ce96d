"""length_aware: prompt-length tiers, each with its own channels (the tier split is the layout's);
inside a tier the least-loaded channel, so a long question never queues behind short ones."""
from __future__ import annotations

import bisect
from collections.abc import Sequence

from kev.router.features import PoolView, QuestionFeatures, least_loaded


def tier_of(num_tokens: int, boundaries: Sequence[int]) -> int:
    """0 for prompts shorter than boundaries[0], 1 below boundaries[1], ..., len(boundaries) above all."""
    return bisect.bisect_right(boundaries, num_tokens)


class LengthAware:
    name = "length_aware"

    def __init__(self) -> None:
        self._turn: dict[tuple[int, ...], int] = {}  # rotates ties so idle channels take turns

    def choose(self, features: QuestionFeatures, channels: Sequence[int], view: PoolView) -> int:
        key = tuple(channels)
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        return least_loaded(channels, view, start=turn % len(channels))
