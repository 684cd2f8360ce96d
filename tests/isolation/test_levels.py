"""strict / shared / loose: the same bits, less memory, no prefill for a repeated public prefix."""
from __future__ import annotations

import pytest
import torch

import kev

SYSTEM = ("You are Kev's careful assistant. You answer briefly and precisely, in the language of the question, "
          "and you never repeat the question. When a question is ambiguous, you pick the most common reading "
          "and say which one you picked. Keep answers under fifty words.")
QUESTIONS = ["解释一下注意力机制", "注意力机制有什么缺点", "What is 2+2?", "Name a colour."]


def level_config(level: str, **core) -> dict:
    return {"isolation": {"level": level, "kv_cache": "split" if level == "strict" else "shared_readonly",
                          "system_prompt": SYSTEM}, "core": core}


@pytest.fixture(scope="module")
def answers(make_engine):
    out = {}
    for level in ("strict", "shared", "loose"):
        engine = make_engine(level_config(level), record_logits=True)
        solo = [engine.generate([q], max_tokens=6, timeout=300)[0] for q in QUESTIONS]
        packed = engine.generate(QUESTIONS, max_tokens=6, timeout=300)
        out[level] = (solo, packed, engine)
    return out


@pytest.mark.parametrize("level", ["strict", "shared", "loose"])
def test_packed_equals_solo_at_every_level(answers, level):
    solo, packed, engine = answers[level]
    for a, b in zip(packed, solo):
        assert a.status == "ok" and a.isolation == level
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
    engine.parts.blocks.check_integrity()


def test_levels_are_bit_identical_to_strict(answers):
    strict = answers["strict"][1]
    for level in ("shared", "loose"):
        for a, b in zip(answers[level][1], strict):
            assert torch.equal(a.logits, b.logits), f"{level} differs from strict for {a.original_text!r}"


def blocks_in_use_after_admission(engine: kev.Engine, n: int) -> tuple[int, int]:
    engine.submit([f"Question number {i}: what is {i} + {i}?" for i in range(n)], max_tokens=2)
    while len(engine.scheduler.running) < n or engine.scheduler.prefixes.jobs:
        engine.step()
    engine.parts.blocks.check_integrity()
    used = engine.parts.blocks.num_used_blocks
    prefix_len = engine.scheduler.running[0].prefix_len
    engine.run_until_idle()
    return used, prefix_len


def test_shared_saves_n_minus_one_prefixes(make_engine):
    n = 6
    strict_used, prefix_len = blocks_in_use_after_admission(make_engine(level_config("strict"), background=False), n)
    shared_used, _ = blocks_in_use_after_admission(make_engine(level_config("shared"), background=False), n)
    full_prefix_blocks = prefix_len // 16
    assert prefix_len > 32
    assert strict_used - shared_used == (n - 1) * full_prefix_blocks
    print(f"N={n}, P={prefix_len}: strict {strict_used} blocks, shared {shared_used} blocks")


def test_loose_reuses_public_prefix_across_requests(make_engine):
    engine = make_engine(level_config("loose"))
    engine.generate(QUESTIONS[:2], max_tokens=2, timeout=300)
    first = engine.stats.num_prefix_tokens_computed
    engine.generate(QUESTIONS[2:], max_tokens=2, timeout=300)
    assert first > 0 and engine.stats.num_prefix_tokens_computed == first, "a repeated public prefix costs no prefill"
    load = engine.load()  # /metrics' kev_prefix_cache_*: one lookup a question, only the first computes
    assert (load.prefix_queries, load.prefix_hits) == (4, 3)


def test_strict_and_shared_never_reuse_across_requests(make_engine):
    engine = make_engine(level_config("shared"))
    engine.generate(QUESTIONS[:2], max_tokens=2, timeout=300)
    first = engine.stats.num_prefix_tokens_computed
    engine.generate(QUESTIONS[2:], max_tokens=2, timeout=300)
    assert engine.stats.num_prefix_tokens_computed == 2 * first
    assert engine.parts.blocks.num_used_blocks == 0
    assert engine.load().prefix_queries == 0, "the prefix cache counters count loose lookups only"


def test_request_may_be_stricter_never_looser(make_engine):
    engine = make_engine(level_config("shared"))
    assert engine.generate(["Hi"], isolation="strict", max_tokens=2, timeout=300)[0].isolation == "strict"
    with pytest.raises(kev.InvalidRequestError, match="looser than the configured cap"):
        engine.submit(["Hi"], isolation="loose")


@pytest.mark.parametrize("isolation,fragment", [
    ({"level": "shared", "kv_cache": "unified"}, "isolation.kv_cache='shared_readonly'"),
    ({"level": "shared", "kv_cache": "shared_readonly", "shared_prefix": False}, "isolation.shared_prefix"),
    ({"level": "loose", "kv_cache": "shared_readonly"}, "isolation.system_prompt"),
    ({"kv_cache": "shared_readonly"}, "isolation.level"),
])
def test_contradictions_fail_at_load_naming_both_keys(isolation, fragment):
    with pytest.raises(kev.ConfigError, match=fragment.replace("(", r"\(")):
        kev.load_config({"isolation": isolation})
