"""ChannelLayout: the pool split into channel groups (category × length tier), fixed at start-up.

Each group owns a contiguous run of channels and a share of the max_parallel_queries slots
of a step, both in proportion to its size. With one group (no categories, no tiers) the
group is the whole pool and its share is every slot. The shares are hard: a group never
runs more than its share, so a burst in one group cannot take the slots of another.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChannelGroup:
    name: str
    channels: tuple[int, ...]
    slots: int  # most questions of this group running in one step


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split total into len(weights) parts >= 1, proportional to weights (largest remainder)."""
    n = len(weights)
    assert 1 <= n <= total, f"cannot split {total} into {n} parts of at least 1"
    rest, weight_sum = total - n, sum(weights)
    exact = [rest * w / weight_sum for w in weights]
    parts = [int(x) for x in exact]
    by_remainder = sorted(range(n), key=lambda i: (parts[i] - exact[i], i))
    for i in by_remainder[: rest - sum(parts)]:
        parts[i] += 1
    return [p + 1 for p in parts]


class ChannelLayout:
    def __init__(self, pool_size: int, max_parallel: int, categories: Sequence[str], num_tiers: int) -> None:
        names = [f"{c}/tier{t}" if categories and num_tiers > 1 else (c if categories else f"tier{t}")
                 for c in (categories or ["all"]) for t in range(num_tiers)]
        if len(names) == 1:
            names = ["all"]
        sizes = apportion(pool_size, [1] * len(names))
        slots = apportion(max_parallel, sizes) if len(names) > 1 else [max_parallel]
        self.groups: list[ChannelGroup] = []
        self.group_of_channel: list[int] = []
        start = 0
        for index, (name, size, share) in enumerate(zip(names, sizes, slots)):
            self.groups.append(ChannelGroup(name, tuple(range(start, start + size)), share))
            self.group_of_channel += [index] * size
            start += size
        self._num_tiers = num_tiers
        self._category_index = {c: i for i, c in enumerate(categories)}

    def group(self, category: str, tier: int) -> ChannelGroup:
        return self.groups[self._category_index.get(category, 0) * self._num_tiers + tier]

    def group_of(self, channel_id: int) -> ChannelGroup:
        return self.groups[self.group_of_channel[channel_id]]
