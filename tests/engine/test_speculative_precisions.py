"""Drafts change no answer at every precision: `kev verify --speculative`'s proof (solo answers decoded without
drafts, random packed mixes with prompt-lookup drafts, extraction questions among them) on bf16 (decode rows on the
row kernel, prompt chunks on the flash prefill kernel), int8 weights, w8a8 (per-token int8 activations) and the
GGUF's own blocks; and seeded sampling at temperature > 0, where each position must consume the same random draw
with drafts as without."""
from __future__ import annotations

import pytest

import kev
from kev.isolation.verify import VERIFY_QUESTIONS, VerifyOptions, run_verify
from tests.engine.test_speculative import EXTRACTION, OFF, same

SMALL = {"core": {"max_context": 512, "prefill_chunk": 32, "max_step_tokens": 128},
         "router": {"max_parallel_queries": 8, "channel_pool_size": 8, "default_timeout_ms": 600_000,
                    "strategy": "round_robin"},
         "speculative": {"method": "prompt_lookup", "max_draft": 6, "max_step_rows": 64,
                         "policy": "rows"}}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "int8", "w8a8", "gguf"])
def test_drafted_packed_answers_equal_plain_solo_bit_for_bit(precision):
    config = kev.load_config(SMALL, {"core": {"precision": precision}})
    with kev.Engine(config, record_logits=True, background=False) as engine:
        report = run_verify(engine, VerifyOptions(VERIFY_QUESTIONS[2:4], trials=2, max_tokens=16, seed=5,
                                                  speculative=True))
        assert report.ok, report.to_dict()
        assert report.identical == report.comparisons and report.max_abs_logit_diff == 0.0
        assert report.accepted_tokens > 0

        sampled = dict(temperature=0.8, top_p=0.95, seed=7, max_tokens=12)
        before = engine.load().spec_accepted_tokens
        plain = [engine.wait(engine.submit([q], speculative=OFF, **sampled), timeout=600)[0] for q in EXTRACTION]
        drafted = engine.wait(engine.submit(EXTRACTION, **sampled), timeout=600)
        for result, reference in zip(drafted, plain):
            same(result, reference)
        assert engine.load().spec_accepted_tokens > before, "no sampled draft was kept: the check proves nothing"
