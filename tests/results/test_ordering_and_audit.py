"""Aggregator ordering modes, audit records and the hot-spot report, on plain results."""
from __future__ import annotations

import argparse
import json

import pytest

from kev.results.audit_records import read_records, result_fields
from kev.results.load_report import percentile, summarize
from kev.results.ordering import order_results
from kev.results.result import Result
from kev.cli import stats_cmd

AUDIT_FIELDS = {"request_id", "index", "channel_id", "hash_bucket", "strategy", "rerouted", "isolation", "started_at",
                "finished_at", "elapsed_ms", "prompt_tokens", "completion_tokens", "finish_reason", "status",
                "original_text", "normalized_text", "queue_ms"}


def results() -> list[Result]:
    # index, finished_at: index 2 finished first, index 0 last
    return [Result("r", 0, finished_at=30.0), Result("r", 1, finished_at=20.0), Result("r", 2, finished_at=10.0)]


def test_slot_map_is_question_order_whatever_finished_first():
    assert [r.index for r in order_results(results()[::-1], "slot_map")] == [0, 1, 2]


def test_seq_append_is_completion_order():
    assert [r.index for r in order_results(results(), "seq_append")] == [2, 1, 0]


def test_priority_is_priority_then_index():
    assert [r.index for r in order_results(results(), "priority", {0: 1, 1: 5, 2: 1})] == [1, 0, 2]


def test_result_records_carry_every_audit_field_and_full_adds_the_answer(tmp_path):
    result = Result("r", 0, text="secret answer", token_ids=[1, 2], hash_bucket=3, channel_id=1)
    summary, full = result_fields(result), result_fields(result, "full")
    assert AUDIT_FIELDS <= set(summary) and "text" not in summary and "token_ids" not in summary
    assert full["text"] == "secret answer" and full["token_ids"] == [1, 2]
    path = tmp_path / "kev.jsonl"
    lines = [{"kind": "result", **summary}, {"kind": "step", "channels": []}, {"kind": "result", **full}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "res', encoding="utf-8")
    assert len(read_records(path)) == 3 and [r["kind"] for r in read_records(path, "result")] == ["result"] * 2


def test_percentile_nearest_rank():
    assert percentile([], 50) == 0.0
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)


def hot_records() -> list[dict]:
    # 8 channels; bucket 7 on channel 2 carries half the traffic
    records = [{"kind": "result", "hash_bucket": 7, "channel_id": 2, "queue_ms": 100.0 * i, "strategy": "semantic_hash"}
               for i in range(20)]
    records += [{"kind": "result", "hash_bucket": 10 + i, "channel_id": i % 8, "queue_ms": 5.0,
                 "strategy": "semantic_hash"} for i in range(20)]
    return records + [{"kind": "step", "channels": 3}, {"kind": "result", "hash_bucket": None, "channel_id": None}]


def test_report_flags_the_hot_bucket_and_the_overloaded_channel():
    report = summarize(hot_records(), hot_share=0.25, epsilon=0.25)
    assert report.num_results == 41 and report.num_channels == 8 and report.strategies == ["semantic_hash"]
    assert [(b.bucket, b.count, b.share) for b in report.hot_buckets] == [(7, 20, 0.5)]
    over = [c for c in report.channels if c.is_over]
    assert [c.channel_id for c in over] == [2] and over[0].count == 23
    assert over[0].load_vs_mean == pytest.approx(23 / 5)
    assert over[0].queue_p99_ms == 1900.0 and report.channels[0].queue_p50_ms == 5.0
    assert sum(c.count for c in report.channels) == 40


def kev_stats(argv: list[str]) -> int:
    """`kev stats ...` without building every other command's parser (those import the engine)."""
    parser = argparse.ArgumentParser()
    stats_cmd.add_arguments(parser)
    return stats_cmd.run(parser.parse_args(argv))


def test_kev_stats_cli(tmp_path, capsys):
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in hot_records()) + '{"torn', encoding="utf-8")
    assert kev_stats([str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_load_vs_mean"] == pytest.approx(4.6) and report["buckets"][0]["is_hot"]
    assert kev_stats([str(path)]) == 0
    out = capsys.readouterr().out
    assert "hot spot: bucket 7 carries 50%" in out and "OVER" in out
