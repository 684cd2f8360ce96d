"""kev plan arithmetic: the article's 7B example, grouped-query attention, levels, sizes. No model needed."""
from __future__ import annotations

import json

import pytest

from kev.config import load_config

from kev.cli.main import main
from kev.engine.kv.memory_plan import ModelShape, PlanInputs, blocks, make_plan, parse_bytes

ARTICLE_7B = ["plan", "--layers", "32", "--hidden", "4096", "--kv-heads", "32", "--head-dim", "128",
              "--max-context", "4096", "--precision", "fp16", "--channels", "8", "--json"]


def plan_json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_article_7b_example_is_16_gib_not_64(capsys):
    plan = plan_json(capsys, ARTICLE_7B)
    # the article prints 68,719,476,736
    assert plan["kv_bytes_article"] == 2 * 32 * 4096 * 4096 * 2 * 8 == 17_179_869_184
    assert plan["kv_bytes"] == plan["kv_bytes_article"], "no grouping in this model: both formulas agree"
    assert plan["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2
    assert plan["weights_bytes"] is None and plan["fits"] is None, "no --params: weights unknown, not guessed"
    strict = plan["levels"][0]
    assert strict["per_channel_max_bytes"] == 2 * 2**30, "about 2 GiB per channel, as the article says"


def test_article_7b_on_a_24_gib_card_fits_four_strict_channels(capsys):
    plan = plan_json(capsys, ARTICLE_7B + ["--params", "7e9", "--device-memory", "24GiB"])
    assert plan["weights_bytes"] == 14_000_000_000
    assert plan["channels_that_fit"] == 4, "the article: about 4 strict channels beside 14 GB of weights"
    assert plan["fits"] is False, "8 channels at max_context do not fit"
    assert plan["weights_bytes"] + 4 * 2**31 + plan["headroom_bytes"] <= 24 * 2**30


def test_weights_from_vocab_and_intermediate(capsys):
    plan = plan_json(capsys, ARTICLE_7B + ["--vocab", "32000", "--intermediate", "11008"])
    assert plan["num_params"] == 6_738_415_616, "Llama-2-7B's parameter count"
    assert plan["weights_bytes"] == 2 * 6_738_415_616


def test_grouped_query_attention_uses_kv_heads(capsys):
    # Llama-3-8B: 32 query heads share 8 KV heads; the article's formula overstates KV by 32/8.
    argv = ["plan", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--max-context", "8192",
            "--precision", "bf16", "--channels", "4", "--json"]
    plan = plan_json(capsys, argv)
    assert plan["head_dim"] == 128
    assert plan["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072
    assert plan["kv_bytes"] == 131_072 * 8192 * 4
    assert plan["kv_bytes_article"] == 4 * plan["kv_bytes"]


def test_default_model_shapes_come_from_its_config_json(capsys):
    plan = plan_json(capsys, ["plan", "--json", "--device-memory", "8GiB"])
    assert (plan["num_layers"], plan["num_kv_heads"], plan["head_dim"]) == (30, 3, 64)
    value_bytes = 4 if load_config({}).core.activation_precision == "fp32" else 2  # precision auto
    assert plan["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * value_bytes
    assert plan["fits"] is True and plan["channels_that_fit"] > 8


def shape() -> ModelShape:
    return ModelShape(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, num_params=10_000)


def inputs(**changes) -> PlanInputs:
    base = dict(shape=shape(), precision="fp32", kv_precision="fp32", max_context=256, block_size=16,
                channels=4, pool_size=6,
                kv_cache="split", typical_tokens=40, prefix_tokens=0, device_memory=None)
    return PlanInputs(**{**base, **changes})


def test_levels_by_mode_and_prefix():
    per_token = 2 * 2 * 2 * 16 * 4
    block = 16 * per_token
    plan = make_plan(inputs(prefix_tokens=37))
    strict, unified, shared, loose = plan.levels
    assert strict.per_channel_typical_bytes == blocks(37 + 40, 16) * block, "strict copies the prefix per channel"
    assert strict.total_max_bytes == 4 * 16 * block
    assert unified.channels == 6 and unified.per_channel_typical_bytes == unified.per_channel_max_bytes == 16 * block
    assert shared.shared_bytes == blocks(37, 16) * block, "prefix stored once (its partial block too, until copied)"
    assert shared.per_channel_typical_bytes == (blocks(77, 16) - 37 // 16) * block
    assert shared.total_typical_bytes < strict.total_typical_bytes
    assert (loose.shared_bytes, loose.total_max_bytes) == (shared.shared_bytes, shared.total_max_bytes)


def test_without_a_prefix_shared_costs_what_strict_costs():
    strict, _, shared, _ = make_plan(inputs()).levels
    assert (shared.total_max_bytes, shared.total_typical_bytes) == (strict.total_max_bytes, strict.total_typical_bytes)


def test_pool_follows_the_engine_rule():
    per_block = 16 * make_plan(inputs()).kv_bytes_per_token
    assert make_plan(inputs()).pool_bytes == 4 * 16 * per_block
    assert make_plan(inputs(kv_cache="unified")).pool_bytes == 6 * 16 * per_block
    assert make_plan(inputs(kv_cache_tokens=100)).pool_bytes == 7 * per_block


def test_fit_is_monotone_in_device_memory():
    fits = [make_plan(inputs(device_memory=m)).channels_that_fit for m in (2**30, 2**31, 2**32, 2**33)]
    assert fits == sorted(fits) and fits[0] >= 0


@pytest.mark.parametrize("text,expected", [("24GiB", 24 * 2**30), ("24GB", 24 * 10**9), ("80G", 80 * 2**30),
                                           ("1.5 MiB", 3 * 2**19), ("1e9", 10**9), ("512", 512)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-3GiB", "24 parsecs", "0"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)
