"""A long document's answer does not depend on how its prompt is chunked or on what shares its steps (bf16, the
prefill kernel): prefilled in chunks of 17, 128 and 2,048 rows, alone or beside other channels, the logits are the
same bits."""
from __future__ import annotations

import pytest
import torch

import kev
from kev.bench.documents import make_document

MAX_TOKENS = 3


@pytest.fixture(scope="module")
def bf16_model():
    from kev.engine.engine_setup import load_model_and_tokenizer

    model_and_tokenizer = load_model_and_tokenizer(kev.load_config({"core": {"precision": "bf16"}}))
    if model_and_tokenizer[0].dtype != torch.bfloat16:
        pytest.skip("no bf16 on this machine")
    return model_and_tokenizer


def engine_with_chunk(bf16_model, chunk: int) -> kev.Engine:
    from kev.engine.engine_setup import build_parts

    config = kev.load_config({"core": {"precision": "bf16", "prefill_chunk": chunk, "max_step_tokens": max(chunk, 512)},
                              "router": {"default_timeout_ms": 600_000, "strategy": "round_robin",
                                         "max_parallel_queries": 8}})
    model, tokenizer = bf16_model
    return kev.Engine(config, build_parts(config, model, tokenizer), record_logits=True)


@pytest.fixture(scope="module")
def documents(bf16_model):
    tokenizer = bf16_model[1]
    count = lambda text: len(tokenizer.encode(text))  # noqa: E731
    return [make_document(0, "en", 700, count).question(0), make_document(1, "zh", 400, count).question(1)]


@pytest.mark.slow
def test_a_documents_logits_do_not_depend_on_its_chunks_or_its_neighbours(bf16_model, documents):
    answers = {}
    for chunk in (17, 128, 2048):
        engine = engine_with_chunk(bf16_model, chunk)
        try:
            answers[chunk] = engine.generate(documents[:1], max_tokens=MAX_TOKENS, timeout=600)[0]
            if chunk == 128:
                packed = engine.generate([documents[1], "Hi", documents[0], "什么是KV Cache?"],
                                         max_tokens=MAX_TOKENS, timeout=600)[2]
        finally:
            engine.close()
    reference = answers[2048]
    assert reference.status == "ok", reference.error
    for result in [answers[17], answers[128], packed]:
        assert result.status == "ok", result.error
        assert result.token_ids == reference.token_ids
        assert torch.equal(result.logits, reference.logits)


@pytest.mark.slow
def test_bf16_shared_start_answers_as_alone(bf16_model, documents):
    engine = engine_with_chunk(bf16_model, 128)
    try:
        assert engine.runner.chunk_invariant
        questions = [documents[1], documents[1].rsplit("\n\n", 1)[0] + "\n\n用一句话总结这份报告。", "Hi"]
        alone = [engine.generate([q], max_tokens=MAX_TOKENS, timeout=600)[0] for q in questions]
        before = engine.stats.num_prefix_tokens_computed
        together = engine.generate(questions, max_tokens=MAX_TOKENS, timeout=600)
        assert engine.stats.num_prefix_tokens_computed > before, "the document's start was computed once, shared"
    finally:
        engine.close()
    for a, b in zip(alone, together):
        assert b.status == "ok", b.error
        assert b.token_ids == a.token_ids and torch.equal(b.logits, a.logits), b.original_text
