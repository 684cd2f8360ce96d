"""Hot spots from the audit log: traffic share per hash bucket and per channel, queue waits.

A bucket is hot when its share of the traffic passes `hot_share` (the article's case: one
bucket carrying half the questions). A channel is over when it took more than (1+ε)× the
mean count of the pool's channels, the line bounded-load hashing promises to stay under.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class BucketLoad:
    bucket: int
    count: int
    share: float
    is_hot: bool
    moved: int = 0  # placed off the strategy's pick (an idle channel, the breaker, a full queue): `rerouted`


@dataclass(frozen=True)
class ChannelLoad:
    channel_id: int
    count: int
    share: float
    load_vs_mean: float  # count / mean count per channel
    queue_p50_ms: float
    queue_p99_ms: float
    is_over: bool


@dataclass(frozen=True)
class LoadReport:
    num_results: int
    strategies: list[str]
    num_channels: int
    hot_share: float
    epsilon: float
    buckets: list[BucketLoad]  # busiest first
    channels: list[ChannelLoad]  # by channel id, idle channels included

    @property
    def hot_buckets(self) -> list[BucketLoad]:
        return [b for b in self.buckets if b.is_hot]

    @property
    def max_load_vs_mean(self) -> float:
        return max((c.load_vs_mean for c in self.channels), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_load_vs_mean": self.max_load_vs_mean}


def summarize(records: Iterable[dict[str, Any]], hot_share: float = 0.25, epsilon: float = 0.25,
              num_channels: int | None = None) -> LoadReport:
    """records: audit records of kind "result" (others are skipped)."""
    results = [r for r in records if r.get("kind", "result") == "result"]
    buckets = Counter(r["hash_bucket"] for r in results if r.get("hash_bucket") is not None)
    moved = Counter(r["hash_bucket"] for r in results if r.get("hash_bucket") is not None and r.get("rerouted"))
    routed = [r for r in results if r.get("channel_id") is not None]
    per_channel = Counter(r["channel_id"] for r in routed)
    waits: dict[int, list[float]] = defaultdict(list)
    for r in routed:
        waits[r["channel_id"]].append(float(r.get("queue_ms") or 0.0))
    n = num_channels or (max(per_channel) + 1 if per_channel else 0)
    total_buckets, total_routed = sum(buckets.values()), len(routed)
    mean = total_routed / n if n else 0.0
    bucket_loads = [BucketLoad(b, c, c / total_buckets, c / total_buckets > hot_share, moved[b])
                    for b, c in buckets.most_common()]
    channel_loads = [
        ChannelLoad(ch, per_channel[ch], per_channel[ch] / total_routed if total_routed else 0.0,
                    per_channel[ch] / mean if mean else 0.0, percentile(waits[ch], 50), percentile(waits[ch], 99),
                    per_channel[ch] > (1 + epsilon) * mean)
        for ch in range(n)
    ]
    strategies = sorted({r.get("strategy") or "" for r in results} - {""})
    return LoadReport(len(results), strategies, n, hot_share, epsilon, bucket_loads, channel_loads)
