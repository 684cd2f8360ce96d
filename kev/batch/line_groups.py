"""Lines of one batch whose prompts share a long start (one document, several tasks: the article's §5.1) go to the
engine as one request, so the engine computes that start once (engine/shared_starts.py) and every answer stays
bit-identical to its line asked alone. A batch belongs to one caller, so strict's rule (no KV reuse across callers)
holds: the start is keyed by that one request.

Lines are grouped only where nothing else about them differs (the same endpoint and options), so one request can
answer them all; each line still gets its own output record, as if it had gone alone.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from kev.results.result import Result
from kev.batch.requests import BatchRequest

MIN_SHARED_CHARS = 256  # Chinese runs near a token a character (the engine then checks for 256 shared tokens)
MAX_GROUP_LINES = 64  # a group answers when its last line does: keep that wait bounded

Positioned = tuple[int, BatchRequest]  # (position in the batch, line)


def prompt_text(request: BatchRequest) -> str:
    """The line's first prompt as text, for finding shared starts (chat: roles and contents in order)."""
    query = request.call.queries[0] if request.call.queries else ""
    if isinstance(query, dict) and isinstance(query.get("messages"), list):
        return "".join(f"{m.get('role', '')}\n{m.get('content', '')}\n" for m in query["messages"])
    if isinstance(query, dict):
        query = query.get("prompt", query.get("text", ""))
    return query if isinstance(query, str) else ""


def _shape(request: BatchRequest) -> str:
    """What must be equal for lines to share one engine request."""
    call = request.call
    return json.dumps([call.shape.kind, call.sampling.to_json(), call.options, call.shape.n, call.keep,
                       call.logprobs, call.echo is not None], sort_keys=True, default=str)


def _common_chars(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def group_lines(requests: list[BatchRequest], min_chars: int = MIN_SHARED_CHARS) -> list[list[Positioned]]:
    """The batch as groups in order of their first line: lines sharing a start of min_chars together."""
    keyed = sorted(((_shape(r), prompt_text(r), i) for i, r in enumerate(requests)))
    groups: list[list[Positioned]] = []
    previous: tuple[str, str] | None = None
    for shape, text, i in keyed:
        joins = (previous is not None and groups and previous[0] == shape and len(groups[-1]) < MAX_GROUP_LINES
                 and _common_chars(previous[1], text) >= min_chars)
        if joins:
            groups[-1].append((i, requests[i]))
        else:
            groups.append([(i, requests[i])])
        previous = (shape, text)
    return sorted(groups, key=lambda group: group[0][0])


def merged_queries(group: list[Positioned]) -> list[Any]:
    return [query for _, request in group for query in request.call.queries]


def split_results(group: list[Positioned], results: list[Result]) -> list[list[Result]]:
    """Each line's results, numbered from 0 as if the line had been its own request."""
    by_index = sorted(results, key=lambda r: r.index)
    out, offset = [], 0
    for _, request in group:
        count = len(request.call.queries)
        out.append([dataclasses.replace(r, index=r.index - offset) for r in by_index[offset:offset + count]])
        offset += count
    return out
