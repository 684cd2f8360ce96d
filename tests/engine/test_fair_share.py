"""FairShare without a model: live before batch, tenants interleaved by weight, priority only within a tenant, the
batch class's caps and per-tenant queue places (kev/engine/fair_share.py)."""
from __future__ import annotations

from kev.config.sharing_config import SharingConfig
from kev.engine.fair_share import FairShare
from kev.engine.question import Question
from kev.engine.sampling_params import SamplingParams


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
