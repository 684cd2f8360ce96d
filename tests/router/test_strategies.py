"""Strategies and the router's policy, on a fake pool: placements are pure functions of load."""
from __future__ import annotations

import random

import pytest

from kev.config.schema import RouterConfig
from kev.router.consistent_hash import HashRing, load_bound
from kev.router.features import QuestionFeatures
from kev.router.length_aware import tier_of
from kev.router.router import Router
from tests.router.fake_pool import FakePool


def router(pool_size: int = 8, **overrides) -> Router:
    config = {"channel_pool_size": pool_size, "max_parallel_queries": pool_size, "breaker_threshold": None,
              "channel_queue_depth": 1000, **overrides}
    return Router(RouterConfig(**config))


def place(r: Router, pool: FakePool, features: QuestionFeatures) -> int:
    placement = r.route(features, pool)
    assert placement is not None
    pool.queued[placement.channel_id] += 1
    return placement.channel_id


def test_round_robin_cycles_through_the_pool():
    r, pool = router(strategy="round_robin"), FakePool.busy(8)
    assert [place(r, pool, QuestionFeatures(10, 3)) for _ in range(16)] == list(range(8)) * 2


def test_semantic_hash_same_bucket_same_channel_when_every_channel_is_busy():
    r, pool = router(strategy="semantic_hash"), FakePool.busy(8)
    channels = {place(r, pool, QuestionFeatures(10, 42)) for _ in range(20)}
    assert channels == {42 % 8}


@pytest.mark.parametrize("strategy", ["semantic_hash", "consistent_hash", "round_robin", "length_aware"])
def test_placement_is_work_conserving(strategy):
    """Identical questions (n > 1 samples) never queue behind each other while a channel is idle."""
    r, pool = router(strategy=strategy, length_tiers=()), FakePool(8)
    placements = []
    for _ in range(8):
        placement = r.route(QuestionFeatures(10, 42), pool)
        pool.running.add(placement.channel_id)
        placements.append(placement)
    assert sorted(p.channel_id for p in placements) == list(range(8))  # one idle channel each
    if strategy == "semantic_hash":  # the bucket's own channel first, then the next idle ones, marked as moved
        assert [p.channel_id for p in placements] == [(42 + i) % 8 for i in range(8)]
        assert [p.rerouted for p in placements] == [False] + [True] * 7
    ninth = r.route(QuestionFeatures(10, 42), pool)
    assert ninth.channel_id in range(8) and pool.queue_length(ninth.channel_id) == 0  # all busy: it may queue now


def test_an_idle_channel_outside_the_group_is_not_taken():
    r = router(strategy="semantic_hash", categories={"refund": ["refund"]})
    groups = {g.name: g.channels for g in r.layout.groups}
    pool = FakePool(8, running=set(groups["refund"]), queue_depth=0)
    assert r.route(QuestionFeatures(5, 1, "refund"), pool) is None  # its group is busy: overflow
    assert r.route(QuestionFeatures(5, 1, "other"), pool).channel_id in groups["other"]


def test_text_hash_fallback_without_encoder_is_stable():
    r = router()
    assert r.describe("怎么退款", 5).bucket == r.describe("怎么退款", 5).bucket
    assert 0 <= r.describe("anything", 5).bucket < 64


@pytest.mark.parametrize("epsilon", [0.1, 0.25, 1.0])
@pytest.mark.parametrize("seed", range(3))
def test_consistent_hash_never_passes_the_bounded_load(epsilon, seed):
    r, pool = router(strategy="consistent_hash", epsilon=epsilon), FakePool(8)
    rng = random.Random(seed)
    for total in range(1, 200):
        bucket = 7 if rng.random() < 0.5 else rng.randrange(64)  # half the traffic on one hot bucket
        place(r, pool, QuestionFeatures(10, bucket))
        assert max(pool.loads()) <= load_bound(total, 8, epsilon)
        if rng.random() < 0.3:  # questions also finish
            busiest = max(range(8), key=pool.load)
            pool.queued[busiest] -= 1


def test_consistent_hash_keeps_a_bucket_together_until_its_channel_is_full():
    r, pool = router(strategy="consistent_hash", epsilon=0.5), FakePool(8)
    for c in range(8):  # a steady background load, so the bound is well above one
        pool.queued[c] = 4
    home = place(r, pool, QuestionFeatures(10, 5))
    assert place(r, pool, QuestionFeatures(10, 5)) == home  # related questions stay together...
    for _ in range(10):
        place(r, pool, QuestionFeatures(10, 5))
    assert pool.load(home) <= load_bound(sum(pool.loads()), 8, 0.5)  # ...until the bound moves them on


def test_ring_spreads_buckets_over_every_channel():
    ring = HashRing(range(8), virtual_nodes=64)
    owners = [ring.walk(b)[0] for b in range(512)]
    counts = [owners.count(c) for c in range(8)]
    assert min(counts) > 0.5 * 512 / 8 and max(counts) < 1.5 * 512 / 8
    assert sorted(ring.walk(3)) == list(range(8))


def test_length_aware_tiers_own_disjoint_channels():
    r, pool = router(strategy="length_aware", length_tiers=[64, 512]), FakePool(8)
    assert [tier_of(n, (64, 512)) for n in (1, 63, 64, 511, 512, 10_000)] == [0, 0, 1, 1, 2, 2]
    seen: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}
    for n in [10, 100, 1000] * 20:
        seen[tier_of(n, (64, 512))].add(place(r, pool, QuestionFeatures(n, 0)))
    assert not (seen[0] & seen[1] or seen[1] & seen[2] or seen[0] & seen[2])
    assert all(seen.values())
    # Inside a tier the least-loaded channel: loads stay within one of each other.
    for group in r.layout.groups:
        loads = [pool.load(c) for c in group.channels]
        assert max(loads) - min(loads) <= 1


def test_categories_route_before_hashing():
    r = router(strategy="semantic_hash", categories={"refund": ["退款", "refund"], "address": ["地址"]})
    pool = FakePool(8)
    assert [r.describe(t, 5).category for t in ("怎么退款", "How do I get a REFUND?", "改地址", "天气")] == \
        ["refund", "refund", "address", "other"]
    groups = {g.name: set(g.channels) for g in r.layout.groups}
    for bucket in range(64):
        assert place(r, pool, QuestionFeatures(5, bucket, "refund")) in groups["refund"]
        assert place(r, pool, QuestionFeatures(5, bucket, "other")) in groups["other"]


def test_breaker_sends_work_off_a_long_queue_and_says_so():
    r, pool = router(strategy="semantic_hash", breaker_threshold=2), FakePool.busy(8)
    first, second = r.route(QuestionFeatures(10, 3), pool), None
    pool.queued[3] += 1
    second = r.route(QuestionFeatures(10, 3), pool)
    pool.queued[3] += 1
    third = r.route(QuestionFeatures(10, 3), pool)  # channel 3's queue is at the threshold now
    assert (first.channel_id, second.channel_id) == (3, 3) and not (first.rerouted or second.rerouted)
    assert third.channel_id != 3 and third.rerouted and pool.queue_length(third.channel_id) == 0


def test_breaker_keeps_the_pick_when_nothing_is_lighter():
    r, pool = router(pool_size=2, strategy="semantic_hash", breaker_threshold=1), FakePool(2)
    pool.queued.update({0: 3, 1: 3})
    placement = r.route(QuestionFeatures(10, 0), pool)
    assert placement.channel_id == 0 and not placement.rerouted


def test_full_queue_spills_then_overflows():
    r, pool = router(pool_size=4, strategy="semantic_hash", channel_queue_depth=2), FakePool.busy(4, queue_depth=2)
    outcomes = []
    for _ in range(9):
        placement = r.route(QuestionFeatures(10, 1), pool)
        outcomes.append(placement)
        if placement:
            pool.queued[placement.channel_id] += 1
    assert [p.channel_id for p in outcomes[:2]] == [1, 1]
    assert all(p.rerouted for p in outcomes[2:8]) and outcomes[8] is None  # 4 channels × depth 2 = 8
    assert [pool.queue_length(c) for c in range(4)] == [2, 2, 2, 2]
