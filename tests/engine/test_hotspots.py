"""The article's hot spot (4.3): half the customer-service traffic is "怎么退款" / "怎么修改地址".

semantic_hash puts the near-variants in one bucket; placement is work-conserving, so the
bucket's channel takes them only while it is idle, and a question queued behind it moves to
a channel that falls idle: no channel piles them up. consistent_hash with bounded loads, or
the breaker, keep every channel at or under (1+ε)× the mean as well. `kev stats` on each run's
audit log reports which is which. The whole stream is one request, so placement is decided
before anything runs (deterministic).
"""
from __future__ import annotations

import argparse

import pytest

from kev.results.audit_records import read_records
from kev.results.load_report import summarize
from kev.cli import stats_cmd

HOT = ["怎么退款", "嗯，怎么退款", "请问怎么退款", "怎么退款！！！", "你好，怎么退款？？", "怎么申请退款",
       "怎么修改地址", "你好，怎么修改地址？", "怎么修改收货地址", "请问怎么修改地址", "嗯，怎么修改地址", "怎么改地址"]
OTHER = ["What is the capital of France?", "写一首关于秋天的诗", "How do I reset my password?", "解释一下注意力机制",
         "List three prime numbers.", "订单什么时候发货", "Who wrote Hamlet?", "推荐一本科幻小说",
         "Why is the sea salty?", "发票怎么开", "Give me a synonym for happy.", "优惠券怎么用"]
STREAM = [q for pair in zip(HOT, OTHER) for q in pair]  # hot and other questions interleaved
EPSILON = 0.25
POOL = 8


def run_stream(make_engine, tmp_path, name: str, **router) -> str:
    path = tmp_path / f"{name}.jsonl"
    engine = make_engine({"core": {"max_context": 256}, "audit": {"path": str(path)},
                          "router": {"channel_pool_size": POOL, "max_parallel_queries": POOL, "channel_queue_depth": 64,
                                     "epsilon": EPSILON, "breaker_threshold": None, **router}})
    results = engine.generate(STREAM, max_tokens=1, timeout_ms=600_000, timeout=600)
    assert all(r.status == "ok" for r in results), [r.error for r in results if r.error]
    return str(path)


def kev_stats_json(path: str, capsys) -> str:
    parser = argparse.ArgumentParser()
    stats_cmd.add_arguments(parser)
    stats_cmd.run(parser.parse_args([path, "--channels", str(POOL), "--epsilon", str(EPSILON)]))
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def logs(make_engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hotspots")
    return {
        "semantic_hash": run_stream(make_engine, tmp, "semantic", strategy="semantic_hash"),
        "consistent_hash": run_stream(make_engine, tmp, "consistent", strategy="consistent_hash"),
        "breaker": run_stream(make_engine, tmp, "breaker", strategy="semantic_hash", breaker_threshold=1),
    }


def test_semantic_hash_reports_the_hot_buckets_but_no_channel_piles_them(logs, capsys):
    report = summarize(read_records(logs["semantic_hash"]), epsilon=EPSILON, num_channels=POOL)
    busiest = max(report.channels, key=lambda c: c.count)
    with capsys.disabled():
        hot = [(b.bucket, f"{b.share:.0%}") for b in report.hot_buckets]
        print(f"\nsemantic_hash: busiest channel {busiest.channel_id} takes {busiest.share:.0%} "
              f"({busiest.load_vs_mean:.2f}x the mean); hot buckets {hot}")
    assert not busiest.is_over and report.hot_buckets  # before issue 13 one channel took >= 40%
    assert report.hot_buckets[0].moved > 0  # the hot bucket's questions were moved off its channel, and it says so
    out = kev_stats_json(logs["semantic_hash"], capsys)
    assert "hot spot: bucket" in out and "OVER" not in out


@pytest.mark.parametrize("run", ["consistent_hash", "breaker"])
def test_bounded_loads_and_the_breaker_keep_every_channel_under_the_line(logs, capsys, run):
    report = summarize(read_records(logs[run]), epsilon=EPSILON, num_channels=POOL)
    with capsys.disabled():
        print(f"\n{run}: busiest channel {report.max_load_vs_mean:.2f}x the mean; "
              f"counts {[c.count for c in report.channels]}; "
              f"rerouted {sum(r['rerouted'] for r in read_records(logs[run], 'result'))}")
    assert report.max_load_vs_mean <= 1 + EPSILON and not any(c.is_over for c in report.channels)
    assert report.hot_buckets  # the traffic is just as skewed: only the placement changed
    assert "OVER" not in kev_stats_json(logs[run], capsys)
