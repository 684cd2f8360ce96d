"""overflow_policy with many more questions than channels: every question answered exactly once,
or (when the pool refuses) not at all; a refused submit leaves nothing behind."""
from __future__ import annotations

import threading
import time

import pytest

import kev

SMALL = {"core": {"max_context": 512}}


def engine_with(make_engine, **router):
    """Two channels, the shipped channel_queue_depth (0): a question is taken only by an idle channel."""
    return make_engine({**SMALL, "router": {"strategy": "round_robin", "channel_pool_size": 2,
                                            "max_parallel_queries": 2, **router}})


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def assert_answered_once(results, n: int) -> None:
    assert sorted(r.index for r in results) == list(range(n))
    assert all(r.status == "ok" for r in results), [r.error for r in results if r.status != "ok"]


def test_wait_blocks_until_every_question_has_a_channel(make_engine):
    engine = engine_with(make_engine, overflow_policy="wait")
    questions = [f"Count to {i}." for i in range(10)]  # 10 questions, 2 channels
    rid = engine.submit(questions, max_tokens=2)
    assert_answered_once(engine.wait(rid, 120), 10)
    assert sum(s["num_served"] for s in engine.channel_states()) == 10


def test_wait_gives_up_after_the_question_timeout_and_withdraws_the_request(make_engine):
    engine = engine_with(make_engine, overflow_policy="wait", channel_pool_size=1, max_parallel_queries=1)
    hog = engine.submit(["Write a long story about the sea."], max_tokens=400)
    wait_until(lambda: engine.channel_states()[0]["state"] != "idle")
    with pytest.raises(kev.OverflowTimeoutError, match="1 channels: 1 running") as err:
        engine.submit(["a", "b", "c"], timeout_ms=200, max_tokens=2)  # "a" waits for the busy channel in vain
    assert isinstance(err.value, TimeoutError)
    assert engine.queue_length() == 0  # nothing of the refused request is left
    engine.cancel(hog)
    assert engine.wait(hog, 60)[0].status == "cancelled"
    assert_answered_once(engine.generate(["a", "b"], max_tokens=2, timeout=60), 2)


def test_queue_returns_at_once_and_rejects_past_max_queue(make_engine):
    engine = engine_with(make_engine, overflow_policy="queue", channel_pool_size=1, max_parallel_queries=1, max_queue=3)
    hog = engine.submit(["Write a long story about the sea."], max_tokens=400)
    wait_until(lambda: engine.channel_states()[0]["state"] != "idle")
    rid = engine.submit([f"Name {i} colours." for i in range(3)], max_tokens=2)  # the FIFO, not a busy channel
    assert engine.queue_length() == 3 and engine.channel_states()[0]["queued"] == 0
    with pytest.raises(kev.RejectedError, match=r"router.max_queue=3"):
        engine.submit(["one too many"], max_tokens=2)
    with pytest.raises(kev.RejectedError):
        engine.submit(["x", "y"], max_tokens=2)
    assert engine.queue_length() == 3  # the refused requests left nothing behind
    engine.cancel(hog)
    assert_answered_once(engine.wait(rid, 120), 3)


def test_reject_refuses_a_third_question_beside_two_busy_channels(make_engine):
    """SPEC §3.5 with the shipped defaults: no channel can start it, so it is refused, not queued."""
    engine = engine_with(make_engine, overflow_policy="reject")
    hogs = engine.submit(["Write a long story about the sea.", "Write a long story about the sky."], max_tokens=400)
    wait_until(lambda: all(s["state"] != "idle" for s in engine.channel_states()))
    with pytest.raises(kev.RejectedError, match="overflow_policy=reject"):
        engine.submit(["Hi"], max_tokens=2)
    assert engine.queue_length() == 0
    engine.cancel(hogs)


def test_reject_names_pool_and_load_and_clients_can_retry(make_engine):
    engine = engine_with(make_engine, overflow_policy="reject")
    with pytest.raises(kev.RejectedError, match=r"channel pool of 2 channels: \d+ running, \d+ queued"):
        engine.submit([f"q{i}" for i in range(3)], max_tokens=2)  # 2 channels × depth 1
    assert engine.queue_length() == 0
    accepted: dict[int, str] = {}
    for i in range(8):  # a client that retries each refused question until it is taken
        while True:
            try:
                accepted[i] = engine.submit([f"Say the number {i}."], max_tokens=2)
                break
            except kev.RejectedError:
                time.sleep(0.01)
    results = [engine.wait(rid, 120) for rid in accepted.values()]
    assert all(len(r) == 1 and r[0].status == "ok" for r in results)
    assert [r[0].original_text for r in results] == [f"Say the number {i}." for i in range(8)]


def test_a_blocked_wait_submit_returns_cancelled_when_the_engine_closes(make_engine):
    engine = engine_with(make_engine, overflow_policy="wait", channel_pool_size=1, max_parallel_queries=1)
    engine.submit(["Write a long story about the sea."], max_tokens=400)
    wait_until(lambda: engine.channel_states()[0]["state"] != "idle")
    outcome: dict[str, str] = {}
    blocked = threading.Thread(target=lambda: outcome.setdefault("rid", engine.submit(["Hi"], max_tokens=2)))
    blocked.start()
    wait_until(lambda: engine.queue_length() == 1)  # in the FIFO, its caller blocked
    engine.close()
    blocked.join(60)
    assert not blocked.is_alive() and engine.results(outcome["rid"])[0].status == "cancelled"
