"""Per-channel sampling: each question samples from its own logits row with its own generator,
so its tokens never depend on the rows beside it."""
from __future__ import annotations

import torch

from kev.engine.plan import SampleRow, reads_argmax_only


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> list[list[int]]:
    """logits: fp32, rows[i] owns 1 + len(rows[i].draft) consecutive rows of it (the step plan's snapshot, so a cancel
    landing meanwhile changes nothing read here). Per question, the tokens it keeps: row j is sampled only when rows
    0..j-1 sampled exactly its draft's tokens, so each token comes from the logits plain decoding computes at its
    position and a seeded generator makes the same draws, one per kept token, in the same order. Greedy rows take one
    batched argmax (an argmax is exact: a row's answer cannot depend on the rows beside it)."""
    greedy = argmax_rows(logits).tolist() if logits.shape[0] else []
    picked: list[list[int]] = []
    first = 0
    for r in rows:
        # A channel that changes its own row first (grammar, logit_bias, penalties) never takes the batched pick.
        batched = reads_argmax_only(r.params, r.grammar)
        tokens: list[int] = []
        for offset in range(len(r.draft) + 1):
            token = greedy[first + offset] if batched else sample_one(logits[first + offset], r.at(offset))
            tokens.append(token)
            if offset == len(r.draft) or token != r.draft[offset]:
                break  # the next row was computed from a token plain decoding would not have chosen
        picked.append(tokens)
        first += len(r.draft) + 1
    return picked


def sample_one(row: torch.Tensor, sample_row: SampleRow) -> int:
    params, question = sample_row.params, sample_row.question
    if params.adjusts_logits:
        row = adjust(row, sample_row)
    if sample_row.grammar is not None:  # this channel's structured output: only its own row is masked
        row = sample_row.grammar.constrain(row)
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
    if question.generator is None:  # one per question, seeded once: its draws never depend on other channels
        question.generator = torch.Generator().manual_seed(question.seed if question.seed is not None else 0)
    return int(torch.multinomial(probs, 1, generator=question.generator))


def adjust(row: torch.Tensor, sample_row: SampleRow) -> torch.Tensor:
    """OpenAI's logit_bias and presence/frequency penalties, from this question's own tokens only."""
    params, row = sample_row.params, row.clone()
    if params.presence_penalty or params.frequency_penalty:
        if sample_row.output_ids:
            counts = torch.bincount(torch.tensor(sample_row.output_ids), minlength=row.numel()).to(row)
            row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(row)
    if params.logit_bias:
        ids = torch.tensor([token for token, _ in params.logit_bias], device=row.device)
        row[ids] += torch.tensor([bias for _, bias in params.logit_bias], dtype=row.dtype, device=row.device)
    return row


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, -1), by Kev's row kernel where it applies (the same indices: the first of equal maxima, a
    NaN the largest; rows in parallel, where torch's ran on one thread)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and hasattr(torch.ops.kev, "argmax_rows"):
        return torch.ops.kev.argmax_rows(logits.contiguous())
    return torch.argmax(logits, dim=-1)
