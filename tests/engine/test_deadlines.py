"""Deadlines (issue 13, point 1): none unless one is set; one that fires says `timeout`, never `length`,
and keeps the partial text cut at a character boundary. The clock is moved, not waited for."""
from __future__ import annotations

from itertools import count

import kev


def age_running_questions(engine: kev.Engine, seconds: float) -> None:
    """The scheduler's clock moves `seconds` each time it is read: a question that has entered its channel is
    `seconds` older by the next step (its first token is sampled; its deadline is checked after that)."""
    readings = count()
    engine.scheduler.clock = lambda: next(readings) * seconds


def test_no_wall_clock_deadline_by_default(make_engine):
    assert kev.load_config({}).router.default_timeout_ms is None
    engine = make_engine({"router": {"default_timeout_ms": None}}, background=False)
    age_running_questions(engine, 3600.0)  # an hour in its channel: still no deadline
    (result,) = engine.generate(["Write a long story about the sea."], max_tokens=6, ignore_eos=True)
    assert (result.status, result.finish_reason, result.completion_tokens) == ("ok", "length", 6)


def test_a_deadline_that_fires_is_a_timeout_with_the_partial_text(make_engine):
    engine = make_engine({"router": {"default_timeout_ms": None}}, background=False)
    age_running_questions(engine, 3600.0)
    results = engine.generate(["Write a long story about the sea.", "Say hi."], max_tokens=6, ignore_eos=True,
                              timeout_ms=60_000)
    for r in results:
        assert (r.status, r.finish_reason) == ("timeout", "timeout")
        assert 0 < r.completion_tokens < 6 and r.text  # what it had so far is kept


def test_an_operator_budget_applies_when_the_request_sets_none(make_engine):
    engine = make_engine({"router": {"default_timeout_ms": 60_000}}, background=False)
    age_running_questions(engine, 3600.0)
    (result,) = engine.generate(["Say hi."], max_tokens=6, ignore_eos=True)
    assert result.finish_reason == "timeout"


def test_a_long_stop_string_holds_back_only_what_could_still_become_it(make_engine):
    """Issue 13, point 7: streaming stays streaming; only a suffix that may grow into the stop string waits."""
    engine = make_engine()
    rid = engine.submit(["Write a long story about the sea."], max_tokens=12, ignore_eos=True, stop=["§" * 300])
    deltas = [e for e in engine.stream(rid, timeout=120) if e.result is None and e.text]
    assert len(deltas) >= 6  # one per word or so, not one final delta of everything
