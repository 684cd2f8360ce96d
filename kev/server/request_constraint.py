"""/v1/query's request-level constraint: one that can match nothing fails the request (a 400 naming
`structured_outputs`), as on every other route; a question's own override that fails stays that question's error
result beside its answered neighbours (the Kev API's rule for one question's input)."""
from __future__ import annotations

import re

from kev.results.result import Result
from kev.wire.bodies.api_models import QuestionObject, SubmitBody
from kev.wire.bodies.errors import ApiError

_QUESTION_PREFIX = re.compile(r"^queries\[\d+\][^:]*: ")


def request_constraint_error(body: SubmitBody, results: list[Result]) -> ApiError | None:
    """The 400 when the request's own structured_outputs failed every question that took it, else None."""
    if body.structured_outputs is None:
        return None
    own = {i for i, q in enumerate(body.queries) if isinstance(q, QuestionObject) and q.structured_outputs is not None}
    inherited = [r for r in results if r.index not in own]
    if not inherited or not all(r.status == "error" and (r.error_field or "").endswith(".structured_outputs")
                                for r in inherited):
        return None
    return ApiError(400, f"structured_outputs: {_QUESTION_PREFIX.sub('', inherited[0].error or '')}",
                    "structured_outputs")
