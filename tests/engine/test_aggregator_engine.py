"""Aggregator on the real engine: timeouts, streaming, cancel, ordering, audit fields, budgets."""
from __future__ import annotations

from collections import defaultdict

import pytest

import kev
from kev.results.audit_records import read_records

AUDIT_FIELDS = ("request_id", "index", "channel_id", "hash_bucket", "strategy", "rerouted", "isolation", "started_at",
                "finished_at", "elapsed_ms", "prompt_tokens", "completion_tokens", "finish_reason", "status",
                "original_text", "normalized_text")


@pytest.fixture(scope="module")
def engine(make_engine, tmp_path_factory):
    audit = tmp_path_factory.mktemp("audit") / "kev.jsonl"
    return make_engine({"core": {"max_context": 512}, "audit": {"path": str(audit)},
                        "router": {"strategy": "round_robin", "channel_pool_size": 6, "max_parallel_queries": 4}})


def idle(engine) -> bool:
    return all(s["state"] == "idle" and s["queued"] == 0 for s in engine.channel_states())


def test_a_tiny_timeout_fails_only_its_own_question(engine):
    results = engine.generate(["Hi", {"text": "Tell me a long story.", "timeout_ms": 1}, "1+1=?", "Name a colour."],
                              max_tokens=4, timeout=120)
    assert [r.status for r in results] == ["ok", "timeout", "ok", "ok"]
    assert results[1].finish_reason == "timeout" and "timeout_ms" in results[1].error
    assert all(r.finish_reason in ("stop", "length") for r in results if r.index != 1)
    assert idle(engine) and engine.parts.blocks.num_used_blocks == 0


def test_timeout_keeps_the_partial_text_and_frees_the_channel(engine):
    rid = engine.submit(["Write a long story about a dragon.", {"text": "Say yes.", "max_tokens": 3}], max_tokens=200)
    streamed = ""
    for event in engine.stream(rid, timeout=60):
        if event.index == 0:
            streamed += event.text
        if event.index == 0 and len(engine._request(rid).questions[0].output_ids) >= 4:
            with engine._lock:  # as if its timeout_ms ran out now: stopped at the next step boundary
                engine._request(rid).questions[0].timeout_ms = 0
            break
    story, other = engine.wait(rid, 120)
    assert story.status == "timeout" and story.finish_reason == "timeout" and story.completion_tokens >= 4
    assert story.text.startswith(streamed) and story.text.strip()
    assert other.status == "ok"
    assert idle(engine)


def test_stream_deltas_concatenate_to_the_final_text_even_when_characters_span_tokens(engine):
    questions = ["用中文写一句关于春天的话。", "Say hello in three languages.", "解释一下什么是KV Cache"]
    rid = engine.submit(questions, max_tokens=12)
    text: dict[int, str] = defaultdict(str)
    tokens: dict[int, list[int]] = defaultdict(list)
    channels: dict[int, set] = defaultdict(set)
    finals = {}
    for event in engine.stream(rid, timeout=60):
        text[event.index] += event.text
        tokens[event.index] += event.token_ids
        channels[event.index].add(event.channel_id)
        if event.finished:
            assert event.index not in finals, "one final event per question"
            finals[event.index] = event.result
    results = engine.results(rid)
    assert sorted(finals) == [0, 1, 2]
    for r in results:
        assert text[r.index] == r.text and tokens[r.index] == r.token_ids
        assert channels[r.index] == {r.channel_id}  # every event of a question is tagged with its channel
    split = [t for r in results for t in r.token_ids if "\ufffd" in engine.tokenizer.decode([t])]
    assert split, "no multi-byte character spanned two tokens; pick a question with more Chinese output"


def test_cancel_stops_every_question_and_frees_channels_and_blocks(engine):
    # 6 = the pool: overflow_policy wait would hold submit() until 2 of 8 had finished
    rid = engine.submit([f"Write a poem about the number {i}." for i in range(6)], max_tokens=300)
    next(iter(engine.stream(rid, timeout=60)))  # something is running
    engine.cancel(rid)
    results = engine.wait(rid, 60)
    assert [r.status for r in results] == ["cancelled"] * 6
    assert all(r.finish_reason == "cancelled" for r in results)
    assert idle(engine) and engine.parts.blocks.num_used_blocks == 0 and engine.queue_length() == 0
    assert engine.generate(["Hi"], max_tokens=2, timeout=60)[0].status == "ok"


def test_every_result_carries_the_audit_fields_and_the_audit_log_has_them(engine):
    rid = engine.submit(["嗯，怎么退款？？？", "What is 2+2?"], max_tokens=3)
    results = engine.wait(rid, 60)
    for r in results:
        record = r.to_dict()
        assert all(record[f] is not None for f in AUDIT_FIELDS)
        assert r.strategy == "round_robin" and r.isolation == "strict" and isinstance(r.hash_bucket, int)
        assert r.started_at <= r.finished_at and r.elapsed_ms > 0 and r.queue_ms >= 0 and r.prompt_tokens > 0
    assert (results[0].original_text, results[0].normalized_text) == ("嗯，怎么退款？？？", "怎么退款?")
    logged = [rec for rec in read_records(engine.config.audit.path, "result") if rec["request_id"] == rid]
    assert sorted(rec["index"] for rec in logged) == [0, 1]
    assert all(set(AUDIT_FIELDS) <= set(rec) and "text" not in rec for rec in logged)


def test_token_times_and_load_for_metrics(engine):
    results = engine.generate(["What is 2+2?", {"prompt": "1, 2, 3,", "max_tokens": 4, "ignore_eos": True}],
                              max_tokens=4, timeout=60)
    for r in results:
        assert r.ttft_ms is not None and r.queue_ms <= r.ttft_ms <= r.queue_ms + r.elapsed_ms
        assert (r.tpot_ms is not None) == (r.completion_tokens >= 2)
        if r.tpot_ms is not None:  # the gaps after the first token fit in the time after it
            assert r.tpot_ms * (r.completion_tokens - 1) <= r.queue_ms + r.elapsed_ms - r.ttft_ms + 1e-3
    load = engine.load()
    assert (load.num_running, load.num_waiting, load.kv_blocks_used) == (0, 0, 0), "idle: nothing held"
    assert load.kv_blocks_total == engine.parts.blocks.num_blocks and load.prefix_queries == 0


def test_budget_caps_are_errors_not_clipping(engine):
    with pytest.raises(kev.InvalidRequestError, match="router.max_tokens_cap"):
        engine.submit(["Hi"], max_tokens=10**6)
    with pytest.raises(kev.InvalidRequestError, match="router.timeout_ms_cap"):
        engine.submit(["Hi"], timeout_ms=10**9)
    ok, too_long = engine.generate(["Hi", {"text": "Hi", "timeout_ms": 10**9}], max_tokens=2, timeout=60)
    assert ok.status == "ok" and too_long.status == "error" and "queries[1].timeout_ms" in too_long.error


@pytest.mark.parametrize("mode, expected", [("priority", [1, 2, 0]), ("seq_append", [1, 2, 0])])
def test_priority_is_admitted_first_and_ordered_first(make_engine, mode, expected):
    engine = make_engine({"core": {"max_context": 512}, "aggregator": {"mode": mode},
                          "router": {"channel_pool_size": 1, "max_parallel_queries": 1}})
    questions = [{"text": "a", "priority": 0}, {"text": "b", "priority": 9}, {"text": "c", "priority": 5}]
    results = engine.generate(questions, max_tokens=2, timeout=60)
    started = sorted(results, key=lambda r: r.started_at)
    assert [r.index for r in started] == [1, 2, 0]  # one channel: the scheduler admits by priority
    assert [r.index for r in results] == expected
