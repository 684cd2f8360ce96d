"""The plan's bytes against what a real engine allocates and holds."""
from __future__ import annotations

import importlib.util

import pytest

import kev
from kev.errors import ConfigError
from kev.engine.kv.memory_plan import WEIGHT_BYTES, inputs_for, make_plan, shape_of

SMALL = {"core": {"max_context": 256, "block_size": 16, "prefill_chunk": 32, "max_step_tokens": 64},
         "router": {"max_parallel_queries": 3, "channel_pool_size": 4}}
QUESTIONS = ["Hi", "Explain what a KV cache is in one sentence.", "写出一个Python快速排序示例"]


def allocated_kv_bytes(engine: kev.Engine) -> int:
    return sum(layer.kv.numel() * layer.kv.element_size() for layer in engine.runner.caches)


def plan_for(engine: kev.Engine, typical_tokens: int = 512, prefix_tokens: int = 0):
    shape = shape_of(engine.runner.model.config)
    return make_plan(inputs_for(engine.config, shape, typical_tokens, prefix_tokens))


@pytest.mark.parametrize("kv_cache", ["split", "unified"])
def test_plan_matches_allocated_kv(make_engine, kv_cache):
    engine = make_engine({**SMALL, "isolation": {"kv_cache": kv_cache}}, background=False)
    plan = plan_for(engine)
    allocated = allocated_kv_bytes(engine)
    block_bytes = 16 * plan.kv_bytes_per_token
    assert plan.kv_bytes_per_token == engine.runner.kv_bytes_per_token
    assert plan.pool_bytes == allocated
    channels = 4 if kv_cache == "unified" else 3
    formula = plan.kv_bytes_per_token * 256 * channels  # 2 x layers x kv_heads x head_dim x tokens x bytes
    assert abs(formula - allocated) <= channels * block_bytes, "within one block per channel"


def test_plan_weights_match_the_model(make_engine):
    engine = make_engine(SMALL, background=False)
    model = engine.runner.model
    plan = plan_for(engine)
    assert plan.weights_bytes == model.weight_bytes() == model.config.num_params * WEIGHT_BYTES["fp32"]


def test_split_channels_hold_what_the_plan_says_at_their_length(make_engine):
    engine = make_engine(SMALL, background=False)
    blocks = engine.parts.blocks
    rid = engine.submit(QUESTIONS, max_tokens=6, timeout_ms=600_000)
    checked = 0
    while engine.parts.scheduler.has_work():
        engine.step()
        for q in engine.parts.scheduler.running:
            plan = plan_for(engine, typical_tokens=q.num_computed)
            held = len(blocks.block_table(q.channel_id)) * 16 * plan.kv_bytes_per_token
            typical = plan.levels[0].per_channel_typical_bytes
            assert held == typical, f"channel {q.channel_id} at {q.num_computed} tokens"
            checked += 1
        assert blocks.num_used_blocks * 16 * plan.kv_bytes_per_token <= plan.levels[0].total_max_bytes
    assert checked and all(r.status == "ok" for r in engine.wait(rid))


def shared_level_available() -> bool:
    """The lead's shared prefix blocks: the config must load and the engine must have a prefix store."""
    if importlib.util.find_spec("kev.engine.kv.prefix_store") is None:
        return False
    try:
        kev.load_config({"isolation": {"level": "shared", "kv_cache": "shared_readonly"}})
    except ConfigError:
        return False
    return True


@pytest.fixture
def shared_engine(make_engine):
    if not shared_level_available():
        pytest.skip("the engine does not run isolation level 'shared' yet")
    return make_engine({**SMALL, "isolation": {"level": "shared", "kv_cache": "shared_readonly"}}, background=False)


def test_shared_prefix_blocks_are_held_once(shared_engine):
    engine, blocks = shared_engine, shared_engine.parts.blocks
    system = "You are a careful technical assistant. Answer briefly and precisely, in plain words, " * 2
    rid = engine.submit(QUESTIONS, max_tokens=4, isolation="shared", system=system, timeout_ms=600_000)
    seen = 0
    while engine.parts.scheduler.has_work():
        engine.step()
        running = [q for q in engine.parts.scheduler.running if q.prefix_len]
        if len(running) < len(QUESTIONS):
            continue
        prefix = running[0].prefix_len
        plans = [plan_for(engine, typical_tokens=q.num_computed - prefix, prefix_tokens=prefix) for q in running]
        shared = plans[0].levels[2]
        block_bytes = 16 * plans[0].kv_bytes_per_token
        expected = shared.shared_bytes + sum(p.levels[2].per_channel_typical_bytes for p in plans)
        held = blocks.num_used_blocks * block_bytes
        # The prefix's partial last block is freed once every channel has copied it.
        assert expected - block_bytes <= held <= expected
        seen += 1
    assert seen and all(r.status == "ok" for r in engine.wait(rid))
