"""Scheduler with per-channel queues, on plain Python objects (no model, no torch)."""
from __future__ import annotations

import random

from kev.config.schema import RouterConfig
from kev.engine.channel_pool import ChannelPool
from kev.engine.prefix_jobs import PrefixJobs
from kev.engine.question import Phase, Question
from kev.engine.sampling_params import SamplingParams
from kev.engine.scheduler import Scheduler, SchedulerLimits
from kev.engine.kv.block_manager import BlockManager
from kev.engine.kv.prefix_store import PrefixStore
from kev.router.features import QuestionFeatures
from kev.router.router import Router


def make_scheduler(max_queue: int = 0, **router: object) -> Scheduler:
    config = RouterConfig(**{"channel_pool_size": 4, "max_parallel_queries": 4, "breaker_threshold": None, **router})
    limits = SchedulerLimits(config.max_parallel_queries, 4096, 64, 1024, False, max_queue)
    pool = ChannelPool(config.channel_pool_size, config.channel_queue_depth)
    blocks = BlockManager(1024, 16)
    return Scheduler(limits, blocks, pool, PrefixJobs(blocks, PrefixStore(blocks)), Router(config))


def question(index: int, bucket: int = 0, priority: int = 0, num_tokens: int = 8, request: str = "r") -> Question:
    q = Question(request, index, [1] * num_tokens, SamplingParams(4), timeout_ms=10**9, priority=priority)
    q.features = QuestionFeatures(num_tokens, bucket)
    return q


def running_indices(s: Scheduler) -> list[int]:
    return sorted(q.index for q in s.running)


def test_same_bucket_questions_start_together_in_idle_channels():
    s = make_scheduler(strategy="semantic_hash")
    qs = [question(i, bucket=5) for i in range(3)]
    assert all(s.add(q) for q in qs)
    s.schedule()
    assert running_indices(s) == [0, 1, 2]  # never one behind the other while channels are idle
    assert [q.channel_id for q in qs] == [1, 2, 3] and [q.rerouted for q in qs] == [False, True, True]


def test_a_queued_question_moves_to_a_channel_that_falls_idle():
    s = make_scheduler(strategy="semantic_hash", channel_queue_depth=4)
    qs = [question(i, bucket=5) for i in range(6)]  # 4 fill the pool, 2 queue behind channel 1
    assert all(s.add(q) for q in qs)
    s.schedule()
    assert running_indices(s) == [0, 1, 2, 3] and [q.channel_id for q in qs[4:]] == [1, 1]
    s.finish(qs[2], "stop")  # channel 3 falls idle while channel 1 is still busy
    s.schedule()
    assert running_indices(s) == [0, 1, 3, 4] and qs[4].channel_id == 3 and qs[4].rerouted
    assert qs[5].channel_id == 1  # no other channel idle: it waits


def test_no_channel_queue_by_default_so_a_busy_group_overflows():
    s = make_scheduler(strategy="semantic_hash", channel_pool_size=2, max_parallel_queries=2)
    qs = [question(i) for i in range(3)]
    assert [s.add(q) for q in qs] == [True, True, False]  # the third waits for nobody: overflow_policy decides


def test_higher_priority_starts_first_within_and_across_channels():
    s = make_scheduler(strategy="round_robin", channel_pool_size=2, max_parallel_queries=1, channel_queue_depth=4)
    qs = [question(i, priority=p) for i, p in enumerate([0, 1, 5, 3, 5])]
    for q in qs:
        s.add(q)
    order = []
    while s.has_work():
        s.schedule()
        (q,) = s.running
        order.append(q.index)
        s.finish(q, "stop")
    assert order == [2, 4, 3, 1, 0]  # priority, then arrival


def test_length_tiers_keep_their_share_of_the_slots():
    s = make_scheduler(strategy="length_aware", length_tiers=[64], channel_pool_size=8)
    longs = [question(i, num_tokens=500) for i in range(6)]
    for q in longs:
        s.add(q)
    s.schedule()
    assert len(s.running) == 2  # the long tier's share of 4 slots
    short = question(99, num_tokens=10)
    s.add(short)
    s.schedule()
    assert short in s.running  # a short question never waits behind long ones


def test_overflow_fifo_holds_what_no_channel_can_take_and_drains_in_order():
    s = make_scheduler(strategy="round_robin", channel_pool_size=2, max_parallel_queries=2, channel_queue_depth=1,
                       max_queue=3)
    qs = [question(i) for i in range(6)]
    placed = [s.add(q) or s.defer(q) for q in qs]
    assert placed == [True, True, True, True, True, False]  # 2 channels × depth 1, then max_queue 3
    assert [q.index for q in s.overflow] == [2, 3, 4]
    s.schedule()  # the two queue heads start; the FIFO moves into the emptied queues, in order
    assert running_indices(s) == [0, 1] and sorted(q.index for q in s.pool.queued()) == [2, 3] and s.overflow == [qs[4]]


def test_random_lifecycle_loses_and_duplicates_nothing():
    rng = random.Random(0)
    s = make_scheduler(max_queue=10_000, strategy="consistent_hash", channel_pool_size=6, max_parallel_queries=3,
                       channel_queue_depth=2, breaker_threshold=1)
    everyone: list[Question] = []
    for _step in range(300):
        for _ in range(rng.randrange(3)):
            q = question(len(everyone), bucket=rng.choice([1, 1, 1, rng.randrange(64)]), priority=rng.randrange(3))
            everyone.append(q)
            if not s.add(q):
                assert s.defer(q)
        s.schedule()
        for q in list(s.running):
            if rng.random() < 0.3:
                s.finish(q, "stop")
        if rng.random() < 0.05 and s.waiting():
            s.finish(rng.choice(s.waiting()), "cancelled")
        places = [id(q) for q in s.running] + [id(q) for q in s.waiting()]
        assert len(places) == len(set(places))
        for q in everyone:
            assert (id(q) in places) != q.is_finished, f"question {q.index} lost or duplicated"
        busy = [c.question for c in s.pool.channels if c.question]
        assert sorted(id(q) for q in busy) == sorted(id(q) for q in s.running)
        assert len(s.running) <= 3 and all(len(c.queue) <= 2 for c in s.pool.channels)
        s.blocks.check_integrity()
    assert any(q.rerouted for q in everyone) and any(q.phase is Phase.FINISHED for q in everyone)


def test_a_question_without_features_is_described_on_arrival():
    s = make_scheduler(strategy="semantic_hash")
    q = Question("r", 0, [1, 2, 3], SamplingParams(2), timeout_ms=10**9, original_text="怎么退款")
    assert s.add(q) and q.features is not None and q.features.num_tokens == 3
    assert q.channel_id == q.features.bucket % 4


def test_a_shadow_rerun_waits_for_an_idle_engine_and_runs_alone():
    s = make_scheduler(strategy="round_robin")
    first = question(0)
    s.add(first)
    s.schedule()
    shadow = question(0)
    shadow.shadow_of = first
    s.add(shadow)
    later = question(1)
    s.add(later)
    s.schedule()
    assert running_indices(s) == [0, 1] and shadow in s.shadows  # busy: the shadow waits
    s.finish(first, "stop")
    s.finish(later, "stop")
    s.schedule()
    assert s.running == [shadow] and shadow.channel_id == first.channel_id
    s.add(question(2))
    s.schedule()
    assert s.running == [shadow]  # nothing joins a shadow re-run
    s.finish(shadow, "stop")
    s.schedule()
    assert running_indices(s) == [2]
