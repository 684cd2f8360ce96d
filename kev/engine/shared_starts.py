"""Shared starts: questions of one request whose prompts begin with the same long run of tokens (one document,
several tasks) get that run as their shared prefix, computed once by a prefix job (engine/prefix_jobs.py) and
attached to each, as a request's declared `system` prompt is.

Why this keeps every answer bit-identical to the question asked alone: a prompt row's bits do not depend on how
its prompt is chunked or which rows share its step (Kev's GEMM is row-invariant, the attention kernels compute a
row from its own channel's keys in an order fixed by its position; model/step_metadata.py), so the start
computed in a prefix job and copied in is the start the question would have computed itself. Engines whose
numerics lack that property (no C++ kernels, tiled torch GEMMs, soft-capped attention) do not group.
Why this keeps strict's rule: a request belongs to one caller, and its prefix entries are keyed by its
request id (engine/kv/prefix_store.py), so nothing computed here is reused by another caller.
"""
from __future__ import annotations

from kev.engine.question import Question

MIN_SHARED_START = 256  # tokens; a shorter common start (a chat template's header) is cheaper to recompute


def common_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def group_shared_starts(questions: list[Question], min_tokens: int = MIN_SHARED_START) -> int:
    """Give each group of questions sharing a start of at least min_tokens tokens that start as prefix_ids (where
    it is longer than a declared one). Returns the number of questions that got one."""
    candidates = [q for q in questions if not q.sampling.prompt_logprobs]  # those score every prompt row in-channel
    ordered = sorted(candidates, key=lambda q: q.prompt_ids)  # prompts sharing a start end up side by side
    # common[i]: the start ordered[i] and ordered[i + 1] share, leaving each at least one token of its own
    common = [min(common_length(a.prompt_ids, b.prompt_ids), len(a.prompt_ids) - 1, len(b.prompt_ids) - 1)
              for a, b in zip(ordered, ordered[1:])]
    grouped: list[Question] = []
    _assign(ordered, common, min_tokens, grouped)
    return len(grouped)


def _assign(run: list[Question], common: list[int], min_tokens: int, grouped: list[Question]) -> None:
    """Within a run of sorted prompts, the longest start each question shares with a group: the run splits where
    neighbours share less than min_tokens more than the whole run does; pieces of two or more recurse (they share
    a start longer by at least min_tokens), lone questions share the run's start."""
    if len(run) < 2:
        return
    shared = min(common)
    keep_together = shared + min_tokens if shared >= min_tokens else min_tokens
    pieces, first = [], 0
    for i, c in enumerate(common):
        if c < keep_together:
            pieces.append((first, i + 1))
            first = i + 1
    pieces.append((first, len(run)))
    lone = [run[a] for a, b in pieces if b - a == 1]
    for a, b in pieces:
        if b - a > 1:
            _assign(run[a:b], common[a:b - 1], min_tokens, grouped)
    if shared >= min_tokens and len(lone) > 1:
        for q in lone:
            if shared > len(q.prefix_ids):
                q.prefix_ids, q.prefix_public = list(q.prompt_ids[:shared]), False
                grouped.append(q)
