"""consistent_hash: a hash ring with virtual nodes and bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

The key is the question's semantic bucket, so related questions meet on the same channel,
until that channel holds its bound: the walk then goes on clockwise to the next channel
under it. Bound = the larger of ceil(mean) and floor((1+ε)·mean), mean counting the new
question: no channel ever holds more than (1+ε)× the mean load (when ε·mean ≥ 1), and
some channel is always under the bound, so the walk always ends.
"""
from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence

from kev.router.features import PoolView, QuestionFeatures


def _point(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, channels: Sequence[int], virtual_nodes: int) -> None:
        nodes = sorted((_point(f"channel-{c}-vnode-{v}"), c) for c in channels for v in range(virtual_nodes))
        self._points = [p for p, _ in nodes]
        self._owners = [c for _, c in nodes]

    def walk(self, key: int) -> list[int]:
        """Distinct channels in clockwise order from the key's point."""
        start = bisect.bisect(self._points, _point(f"bucket-{key}"))
        n = len(self._owners)
        return list(dict.fromkeys(self._owners[(start + i) % n] for i in range(n)))


def load_bound(total_after: int, num_channels: int, epsilon: float) -> int:
    mean = total_after / num_channels
    return max(math.ceil(mean), math.floor((1 + epsilon) * mean))


class ConsistentHash:
    name = "consistent_hash"

    def __init__(self, virtual_nodes: int, epsilon: float) -> None:
        self.virtual_nodes, self.epsilon = virtual_nodes, epsilon
        self._rings: dict[tuple[int, ...], HashRing] = {}  # one ring per channel group, built once

    def choose(self, features: QuestionFeatures, channels: Sequence[int], view: PoolView) -> int:
        key = tuple(channels)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = HashRing(channels, self.virtual_nodes)
        bound = load_bound(sum(view.load(c) for c in channels) + 1, len(channels), self.epsilon)
        return next(c for c in ring.walk(features.bucket) if view.load(c) < bound)
