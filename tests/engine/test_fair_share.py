"""FairShare without a model: live before batch, tenants interleaved by weight, priority only within a tenant, the
batch class's caps and per-tenant queue places (kev/engine/fair_share.py)."""
from __future__ import annotations

from kev.config.sharing_config import SharingConfig
from kev.engine.fair_share import FairShare
from kev.engine.question import Question
from kev.engine.sampling_params import SamplingParams
from kev.router.features import QuestionFeatures


def ask(tenant: str, arrival: int, work_class: str = "live", priority: int = 0) -> Question:
    q = Question(f"{tenant}-{arrival}", 0, [1, 2, 3], SamplingParams(), None, priority, tenant=tenant,
                 work_class=work_class)
    q.arrival = arrival
    return q


def names(questions: list[Question]) -> list[str]:
    return [q.request_id for q in questions]


def test_live_comes_before_batch_and_tenants_take_turns() -> None:
    fair = FairShare(SharingConfig(), max_parallel=8)
    waiting = [ask("b", i, "batch") for i in range(3)] + [ask("b", 3 + i) for i in range(3)] + [ask("a", 9)]
    order = names(fair.order(waiting))
    assert order[:4] == ["b-3", "a-9", "b-4", "b-5"], "live first; a's one question is not behind b's three"
    assert order[4:] == ["b-0", "b-1", "b-2"]


def test_weights_share_the_slots_and_idle_time_banks_no_credit() -> None:
    fair = FairShare(SharingConfig(weights={"a": 2}), max_parallel=8)
    waiting = [ask("a", i) for i in range(6)] + [ask("b", 10 + i) for i in range(6)]
    first_six = [q.tenant for q in fair.order(waiting)[:6]]
    assert first_six.count("a") == 4 and first_six.count("b") == 2, first_six
    for q in [ask("b", 100 + i) for i in range(50)]:  # b ran alone for a long while
        fair.started(q)
    late = [ask("a", 200), ask("a", 201)] + [ask("b", 300 + i) for i in range(4)]
    assert [q.tenant for q in fair.order(late)[:3]].count("a") >= 1, "a does not wait behind b's whole history"


def test_priority_orders_a_tenants_own_questions_only() -> None:
    fair = FairShare(SharingConfig(), max_parallel=8)
    waiting = [ask("a", 0), ask("a", 1, priority=5), ask("b", 2, priority=-5), ask("b", 3, priority=99)]
    order = fair.order(waiting)
    tenants = [q.tenant for q in order]
    assert sorted(tenants[:2]) == sorted(tenants[2:]) == ["a", "b"], "turns, whatever the priority"
    assert [n for n in names(order) if n[0] == "a"] == ["a-1", "a-0"] and [n for n in names(order) if n[0] == "b"] \
        == ["b-3", "b-2"]


def test_the_batch_caps_and_the_queue_places() -> None:
    fair = FairShare(SharingConfig(batch_share=0.5, batch_reserve=1), max_parallel=8, max_queue=10)
    assert fair.batch_cap(live_present=True) == 4 and fair.batch_cap(live_present=False) == 7
    assert FairShare(SharingConfig(batch_share=0.0), max_parallel=8).batch_cap(True) == 0
    held = [ask("b", i) for i in range(5)]
    assert fair.queue_room("b", held), "alone, b may use the whole queue"
    assert fair.queue_room("a", held)
    assert not fair.queue_room("b", held), "once a has asked, b's share is half of router.max_queue"
    capped = FairShare(SharingConfig(tenant_max_queue=2), max_parallel=8, max_queue=10)
    assert not capped.queue_room("b", held[:2]) and capped.queue_room("b", held[:1])


def test_the_scheduler_starts_live_before_batch_and_caps_batch_lines() -> None:
    """The same rules in the scheduler (kev/engine/scheduler.py): 4 slots, 8 channels, sharing's defaults."""
    from tests.engine.test_scheduler_queues import make_scheduler

    s = make_scheduler(strategy="round_robin", channel_pool_size=8, max_parallel_queries=4)

    def add(tenant: str, index: int, work_class: str) -> Question:
        q = Question(f"{tenant}-{index}", index, [1, 2, 3], SamplingParams(4), timeout_ms=10**9, tenant=tenant,
                     work_class=work_class)
        q.features = QuestionFeatures(3, 0)
        assert s.add(q)
        return q

    lines = [add("b", i, "batch") for i in range(4)]
    s.schedule()
    assert sum(q in s.running for q in lines) == 3, "alone, batch lines leave sharing.batch_reserve (1) slot free"
    live = add("a", 10, "live")
    s.schedule()
    assert live in s.running, "a live question starts at once in the slot batch lines left"
    s.finish(next(q for q in lines if q in s.running), "stop")
    s.schedule()
    assert sum(q in s.running for q in lines) == 2, "with live work there, batch lines hold at most half the slots"
    more = [add("a", 11 + i, "live") for i in range(3)]
    s.schedule()
    assert sum(q in s.running for q in more) == 1 and len(s.running) == 4, "2 batch lines, 2 live"
    s.finish(live, "stop")
    s.schedule()
    assert sum(q in s.running for q in more) == 2 and sum(q in s.running for q in lines) == 2, \
        "the freed slot goes to a waiting live question, not to the batch line that waited longer"
