"""Prompt-lookup drafts on Kev's Triton kernels (the interpreter, fp32): each drafted row is a decode row of its
channel (PagedRows: its own length and block table), eager and over the decode buckets the CUDA graphs replay, so a
drafted answer equals the plain one bit for bit, alone and packed, greedy and seeded at temperature > 0."""
from __future__ import annotations

import random

import pytest
import torch

import kev
from kev.engine.engine_setup import build_parts
from kev.model.weights import random_model
from tests.model.triton.conftest import TINY, needs_triton

CPU = torch.device("cpu")
OFF = {"method": "off"}


@pytest.fixture(scope="module")
def engines(default_model):
    needs_triton(CPU)
    _, tokenizer = default_model
    made = {}
    for name in ("triton", "graphs"):
        model = random_model(TINY, "fp32", CPU, max_positions=256)
        config = kev.load_config({"router": {"max_parallel_queries": 4, "channel_pool_size": 4,
                                             "strategy": "round_robin", "default_timeout_ms": 600_000},
                                  "core": {"precision": "fp32", "max_context": 256, "kernels": "triton",
                                           "prefill_chunk": 16, "max_step_tokens": 64, "linear_tile": 4},
                                  "speculative": {"method": "prompt_lookup", "max_draft": 3, "min_match": 1,
                                                  "max_match": 2, "max_step_rows": 16,
                                                  "policy": "rows"}})
        engine = kev.Engine(config, build_parts(config, model, tokenizer), record_logits=True)
        if name == "graphs":  # drafted rows are decode rows: a drafted step runs over the buckets too
            engine.runner.use_decode_graphs(16, 256)
        made[name] = engine
    yield made
    for engine in made.values():
        engine.close()


def questions(**sampling: object) -> list[dict]:
    """Prompts that repeat themselves, so the lookup finds matches; a random model's answers tend to loop, which the
    lookup drafts from the answer itself."""
    rng = random.Random(3)
    out = []
    for n in (6, 11):
        part = [rng.randrange(TINY.vocab_size) for _ in range(n)]
        out.append({"prompt_ids": part * 3, "max_tokens": 8, "ignore_eos": True, **sampling})
    return out


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.3, "top_k": 4, "seed": 4}], ids=["greedy", "seeded"])
def test_drafted_rows_on_triton_equal_plain_decoding(engines, sampling):
    for name, engine in engines.items():
        plain = [engine.generate([q], speculative=OFF, timeout=600)[0] for q in questions(**sampling)]
        before = engine.load().spec_draft_tokens
        alone = [engine.generate([q], timeout=600)[0] for q in questions(**sampling)]
        packed = engine.generate(questions(**sampling)[::-1], timeout=600)[::-1]
        assert engine.load().spec_draft_tokens > before, f"{name}: nothing drafted"
        for reference, one, together in zip(plain, alone, packed):
            for result in (one, together):
                assert result.status == "ok", result.error
                assert result.token_ids == reference.token_ids, name
                assert torch.equal(result.logits, reference.logits), f"{name}: drafted logits differ from plain"
    if not sampling:  # a sampled random model rarely repeats itself: drafts are proposed, few are kept
        assert all(engine.load().spec_accepted_tokens > 0 for engine in engines.values())
    graphs = engines["graphs"].runner.graphs
    assert graphs is not None and graphs.steps_run > 0
