"""Questions of one call that share a long start (a document, several tasks) compute that start once, and every
answer is bit-identical to the question asked alone."""
from __future__ import annotations

import pytest
import torch

from kev.bench.documents import make_document
from kev.engine.question import Question, SamplingParams
from kev.engine.shared_starts import group_shared_starts

MAX_TOKENS = 4


def question(ids: list[int], prompt_logprobs: bool = False) -> Question:
    return Question("r", 0, ids, SamplingParams(max_tokens=4, prompt_logprobs=prompt_logprobs), None, 0, "strict",
                    None)


def test_each_group_gets_the_longest_start_it_shares():
    header, doc_a, doc_b = list(range(300)), list(range(1000, 2000)), list(range(5000, 6000))
    qs = [question(header + doc_a + [1, 2]), question(header + doc_a + [3]), question(header + doc_a + [1, 2, 9]),
          question(header + doc_b + [1]), question(header + doc_b + [2]), question(header + [7] * 10),
          question(header + [8] * 10), question([1, 2, 3]), question(header + doc_b + [4], prompt_logprobs=True)]
    assert group_shared_starts(qs) == 7
    assert [len(q.prefix_ids) for q in qs] == [1300, 1300, 1300, 1300, 1300, 300, 300, 0, 0]
    assert all(q.prompt_ids[:len(q.prefix_ids)] == q.prefix_ids for q in qs)
    assert group_shared_starts([question([5] * 400), question([5] * 400)]) == 2  # equal prompts keep a token each
    assert qs[0].prefix_ids and not qs[0].prefix_public


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine({"router": {"max_parallel_queries": 8, "channel_pool_size": 16}}, record_logits=True)


def test_a_documents_tasks_share_its_start_and_answer_as_alone(engine):
    if not engine.runner.chunk_invariant:
        pytest.skip("this engine's numerics are not chunk-invariant (no C++ kernels): it does not group")
    count = lambda text: len(engine.tokenizer.encode(text))  # noqa: E731
    docs = [make_document(0, "en", 400, count), make_document(1, "zh", 300, count)]
    questions = [d.question(t) for d in docs for t in range(3)] + ["Hi"]
    alone = [engine.generate([q], max_tokens=MAX_TOKENS, timeout=600)[0] for q in questions]
    before = engine.stats.num_prefix_tokens_computed
    together = engine.generate(questions, max_tokens=MAX_TOKENS, timeout=600)
    prefix_tokens = engine.stats.num_prefix_tokens_computed - before
    doc_tokens = sum(count(d.text) for d in docs)
    assert doc_tokens * 0.9 < prefix_tokens < doc_tokens * 1.2, "each document's start computed once"
    for a, b in zip(alone, together):
        assert b.status == "ok", b.error
        assert b.token_ids == a.token_ids and torch.equal(b.logits, a.logits), b.original_text
