"""The mixed benchmark batch is what the speed goal names: ≥150 questions, some 150–400-token prompts,
most short, Chinese and English, and the same list every time."""
from __future__ import annotations

from kev.bench.mixed_questions import mixed_questions


def test_mixed_batch_shape(default_model):
    tokenizer = default_model[1]
    questions = mixed_questions()
    assert len(questions) >= 150 and questions == mixed_questions()
    lengths = [len(tokenizer.encode(q)) for q in questions]
    long = [n for n in lengths if n >= 120]
    assert 20 <= len(long) <= len(questions) // 4 and max(lengths) <= 400
    assert any("\u4e00" <= ch <= "\u9fff" for q in questions for ch in q)
    assert sum(q.isascii() for q in questions) > len(questions) // 3
