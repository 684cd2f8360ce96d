"""Isolation proven, not claimed: every answer in a packed batch equals its solo run bit for bit."""
from __future__ import annotations

import random
import time

import pytest
import torch

QUESTIONS = [
    "解释一下注意力机制",
    "注意力机制有什么缺点",
    "Hi",
    "What is the capital of France? Answer in one word.",
    "写出一个Python快速排序示例",
    "List three prime numbers.",
    "Summarise in two sentences why the sky looks blue during the day and red at sunset, "
    "mentioning Rayleigh scattering, the path length of sunlight through the atmosphere, "
    "and why clouds look white while the sea often looks blue or green on a sunny day.",
    "解释一下什么是KV Cache",
    "1+1=?",
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def engine(make_engine):
    # A small prefill chunk so the long question is cut into several chunks; round_robin so
    # every question of a batch gets its own channel and they all share each step.
    return make_engine({"core": {"prefill_chunk": 16, "max_step_tokens": 64}, "router": {"max_parallel_queries": 16,
                        "channel_pool_size": 24, "strategy": "round_robin"}}, record_logits=True)


@pytest.fixture(scope="module")
def make_engine_bf16():
    import kev

    engine = kev.Engine.from_config({"core": {"precision": "bf16", "prefill_chunk": 16, "max_step_tokens": 64},
                                     "router": {"default_timeout_ms": 600_000}},
                                    record_logits=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def solo(engine):
    return {q: engine.generate([q], max_tokens=MAX_TOKENS, timeout=300)[0] for q in QUESTIONS}


def assert_same_as_solo(result, reference) -> None:
    assert result.status == "ok", result.error
    assert result.token_ids == reference.token_ids, result.original_text
    assert torch.equal(result.logits, reference.logits), f"logits differ for {result.original_text!r}"


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_batch_equals_solo(engine, solo, seed):
    order = QUESTIONS[:]
    random.Random(seed).shuffle(order)
    results = engine.generate(order, max_tokens=MAX_TOKENS, timeout=300)
    assert len({r.channel_id for r in results}) == len(order), "each question has its own channel"
    for question, result in zip(order, results):
        assert result.original_text == question
        assert_same_as_solo(result, solo[question])


def test_question_joining_mid_generation_equals_solo(engine, solo):
    steps_before = engine.num_steps
    first = engine.submit(QUESTIONS[:5], max_tokens=MAX_TOKENS)
    deadline = time.monotonic() + 60
    while engine.num_steps < steps_before + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    late = engine.submit(QUESTIONS[5:], max_tokens=MAX_TOKENS)
    for result in engine.wait(first, 300) + engine.wait(late, 300):
        assert_same_as_solo(result, solo[result.original_text])


def test_seeded_sampling_is_per_channel(engine):
    alone = engine.generate(["Tell me a story."], temperature=0.9, top_p=0.9, seed=7, max_tokens=10, timeout=300)[0]
    mixed = engine.generate(["Write a poem.", "Tell me a story.", "Hi"], temperature=0.9, top_p=0.9, seed=7,
                            max_tokens=10, timeout=300)
    assert mixed[1].token_ids == alone.token_ids


def test_bf16_packed_batch_equals_solo(make_engine_bf16):
    engine = make_engine_bf16
    questions = QUESTIONS[:6]
    solo = [engine.generate([q], max_tokens=8, timeout=300)[0] for q in questions]
    packed = engine.generate(questions[::-1], max_tokens=8, timeout=300)[::-1]
    for result, reference in zip(packed, solo):
        assert_same_as_solo(result, reference)
