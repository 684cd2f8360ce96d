"""kev stress: the soak ends by itself with no failures or alerts on strict; its checks catch what they must."""
from __future__ import annotations

import json
import random
import time
from collections import Counter
from types import SimpleNamespace

import pytest

import kev
from kev.engine.engine_setup import build_parts
from kev.isolation.alert_log import audit_target, read_alerts
from kev.isolation.stress import Answer, LevelReport, Soak, StressOptions, check_solo, run_stress
from kev.isolation.stress_questions import make_questions


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return default_model[1]


def test_questions_vary_and_some_end_near_max_context(tokenizer):
    questions = make_questions(tokenizer, 24, 256, random.Random(0), [None, "Be brief."])
    lengths = sorted(q.prompt_tokens for q in questions)
    assert len(questions) == 24 and len({(q.text, q.system) for q in questions}) == 24
    assert lengths[-1] < 256 and sum(n >= 248 for n in lengths) >= 4, "one in six ends 2-8 tokens short"
    assert lengths[0] < 60 and any(60 < n < 200 for n in lengths)
    assert {q.system for q in questions} == {None, "Be brief."}


def test_strict_soak_ends_in_time_without_failures_or_alerts(default_model):
    model, tokenizer = default_model
    base = kev.load_config({"core": {"max_context": 256},
                            "router": {"max_parallel_queries": 4, "channel_pool_size": 6}})
    engines = []

    def factory(config):
        engines.append(kev.Engine(config, build_parts(config, model, tokenizer)))
        return engines[-1]

    options = StressOptions(duration_s=10, num_questions=8, max_tokens=6, levels=("strict",), seed=1)
    report = run_stress(factory, base, options)
    level = report.levels[0]
    assert report.duration_s < 10 + 20, "ends by itself (one step or one solo run may overrun)"
    assert level.submitted > 0 and level.failed == 0, level.problems
    assert level.completed + level.timed_out + level.cancelled == level.submitted
    assert level.isolation_alerts == 0 and level.all_match and report.ok, report.to_dict()
    assert level.solo_checked <= level.solo_distinct
    assert all(e.parts.blocks.num_used_blocks == 0 for e in engines), "every block came back"
    json.dumps(report.to_dict())


def test_solo_check_catches_a_different_answer(make_engine):
    engine = make_engine({"core": {"max_context": 256}}, background=True)
    report = LevelReport("strict")
    soak = Soak(engine, "strict", None, StressOptions(), random.Random(0), report)
    solo = engine.generate(["Hi"], max_tokens=3, timeout=600)[0].token_ids
    answers = {("Hi", None): [Answer(solo[:2], "length", 2), Answer(solo, "length", 3)],
               ("Say yes.", None): [Answer([1, 2], "stop", 3)]}  # stopped early: cannot be its solo answer
    check_solo(soak, answers, until=time.monotonic() + 600)
    assert (report.solo_checked, report.solo_matched) == (2, 1)
    assert not report.all_match and not report.ok


def test_alerts_are_read_from_the_audit_log(tmp_path):
    log = tmp_path / "audit.jsonl"
    lines = [{"kind": "step", "channels": 3}, {"kind": "alert", "alert": "block_in_two_tables"},
             {"kind": "alert", "alert": "truncation_near_boundary"}, {"kind": "alert", "alert": "block_in_two_tables"}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_alerts(log) == (Counter({"block_in_two_tables": 2, "truncation_near_boundary": 1}), 4)
    offset = len(json.dumps(lines[0])) + 1
    assert read_alerts(log, offset)[1] == 3, "a shared log is read from where this run started"
    report = LevelReport("strict", alerts={"truncation_near_boundary": 3})
    assert report.isolation_alerts == 0 and report.ok, "a soak cuts answers at max_context on purpose"
    assert not LevelReport("strict", alerts={"cross_channel_visible": 1}).ok


def test_audit_target(tmp_path):
    no_audit = SimpleNamespace()
    assert audit_target(no_audit, tmp_path, "strict") == ({}, None), "no audit section: not collected"
    own = SimpleNamespace(audit=SimpleNamespace(path="/var/log/kev.jsonl"))
    assert audit_target(own, tmp_path, "strict")[1].name == "kev.jsonl"
    unset = SimpleNamespace(audit=SimpleNamespace(path=None))
    overrides, path = audit_target(unset, tmp_path, "shared")
    assert overrides == {"audit": {"path": str(tmp_path / "audit-shared.jsonl")}} and path.parent == tmp_path
