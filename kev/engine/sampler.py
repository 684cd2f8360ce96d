"""Per-channel sampling: each question samples from its own logits row with its own generator,
so its tokens never depend on the rows beside it."""
from __future__ import annotations

import torch

from kev.engine.question import Question


def sample(logits: torch.Tensor, questions: list[Question]) -> list[int]:
    """logits: [num_questions, vocab] fp32, row i belongs to questions[i]. Greedy rows take one batched
    argmax (an argmax is exact: a row's answer cannot depend on the rows beside it)."""
    greedy = torch.argmax(logits, dim=-1).tolist() if logits.shape[0] else []
    return [greedy[i] if q.sampling.is_greedy else sample_one(row, q) for i, (row, q) in enumerate(zip(logits, questions))]


def sample_one(row: torch.Tensor, question: Question) -> int:
    params = question.sampling
    if params.is_greedy:
        return int(torch.argmax(row))
    scores = row / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scores, min(params.top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) > params.top_p  # keep the token that crosses top_p
        scores = scores.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=question.generator))
