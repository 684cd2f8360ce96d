"""Paged KV: split holds exactly what its tokens need, unified reserves max_context, blocks come back."""
from __future__ import annotations

import pytest

QUESTIONS = ["Hi", "Explain what a KV cache is in one sentence.", "写出一个Python快速排序示例", "1+1=?"]


def blocks_needed(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def test_split_holds_exactly_what_tokens_need(make_engine):
    engine = make_engine({"core": {"block_size": 8, "prefill_chunk": 16, "max_step_tokens": 32}}, background=False)
    parts = engine.parts
    rid = engine.submit(QUESTIONS, max_tokens=6)
    while parts.scheduler.has_work():
        engine.step()
        parts.blocks.check_integrity()
        for q in parts.scheduler.running:
            assert len(parts.blocks.block_table(q.channel_id)) == blocks_needed(q.num_computed, 8)
    assert all(r.status == "ok" for r in engine.wait(rid))
    assert parts.blocks.num_used_blocks == 0, "every block returns to the pool"
    assert all(parts.blocks.block_table(c.channel_id) == [] for c in parts.pool.channels)


def test_unified_reserves_max_context_and_answers_the_same(make_engine):
    split = make_engine({"core": {"max_context": 256}})
    unified = make_engine({"core": {"max_context": 256}, "isolation": {"kv_cache": "unified"},
                           "router": {"channel_pool_size": 8, "max_parallel_queries": 4}})
    per_channel = blocks_needed(256, 16)
    tables = [unified.parts.blocks.block_table(c) for c in range(8)]
    assert all(len(t) == per_channel for t in tables)
    assert len({b for t in tables for b in t}) == 8 * per_channel, "no block is in two channels"
    a = split.generate(QUESTIONS, max_tokens=6, timeout=300)
    b = unified.generate(QUESTIONS, max_tokens=6, timeout=300)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert all(len(unified.parts.blocks.block_table(c)) == per_channel for c in range(8))
    unified.parts.blocks.check_integrity()


def test_reused_channel_starts_empty(make_engine):
    engine = make_engine({"router": {"channel_pool_size": 1, "max_parallel_queries": 1}})
    first = engine.generate(["Tell me a secret word: PELICAN-42."], max_tokens=8, timeout=300)[0]
    second = engine.generate(["What word did I just tell you?"], max_tokens=8, timeout=300)[0]
    fresh = make_engine({"router": {"channel_pool_size": 1, "max_parallel_queries": 1}})
    alone = fresh.generate(["What word did I just tell you?"], max_tokens=8, timeout=300)[0]
    assert first.channel_id == second.channel_id == 0
    assert second.token_ids == alone.token_ids, "the channel's next occupant sees nothing of the last one"
    assert engine.parts.blocks.num_used_blocks == 0


@pytest.mark.parametrize("tokens,expected", [(1, 1), (16, 1), (17, 2), (0, 0)])
def test_blocks_for(tokens, expected):
    from kev.engine.kv.block_manager import BlockManager

    assert BlockManager(4, 16).blocks_for(tokens) == expected
