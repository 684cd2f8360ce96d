"""Channel groups partition the pool and the step's slots."""
from __future__ import annotations

import pytest

from kev.router.layout import ChannelLayout, apportion


@pytest.mark.parametrize("total, weights", [(16, [1, 1, 1]), (8, [6, 5, 5]), (8, [1]), (7, [100, 1, 1]),
                                            (3, [1, 1, 1])])
def test_apportion_sums_and_floors(total, weights):
    parts = apportion(total, weights)
    assert sum(parts) == total and min(parts) >= 1 and len(parts) == len(weights)


@pytest.mark.parametrize("pool, parallel, categories, tiers", [
    (16, 8, [], 1), (16, 8, [], 3), (16, 8, ["a", "b", "other"], 2), (5, 5, ["a", "other"], 2),
    (24, 16, ["x", "other"], 1)])
def test_groups_partition_channels_and_slots(pool, parallel, categories, tiers):
    layout = ChannelLayout(pool, parallel, categories, tiers)
    channels = [c for g in layout.groups for c in g.channels]
    assert sorted(channels) == list(range(pool))
    assert sum(g.slots for g in layout.groups) == parallel
    assert all(layout.group_of(c).channels.count(c) == 1 for c in range(pool))
    assert len(layout.groups) == max(1, len(categories)) * tiers
