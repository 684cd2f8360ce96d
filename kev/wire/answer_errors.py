"""What a question that ended in error means to an OpenAI-style caller: one rule for the live routes, their
streams and every batch line, so a body gets the same status, type and `param` wherever it is sent.

The caller's input at fault (the result names its field in `error_field`: a prompt longer than the context,
a token id outside the vocabulary, a constraint that cannot compile or that led nowhere) is a 400 naming the
body field it came in; a request-level option the engine refused is a 422 naming that option (as
InvalidRequestError is on the route); only the engine's own failure is a 500.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kev.results.result import Result
from kev.wire.bodies.errors import ApiError
from kev.wire.openai_format import Kind

_QUESTION_PREFIX = re.compile(r"^queries\[\d+\][^:]*: ")
_TOKEN_INDEX = re.compile(r"^queries\[\d+\]\.prompt_ids\[(\d+)\]")


@dataclass(frozen=True)
class BodyShape:
    """How a body's questions map back to its fields: question index = prompt index x n + candidate."""

    kind: Kind
    n: int  # candidates per prompt
    single_prompt: bool = False  # completions: `prompt` was one string or one list of ids (errors name "prompt")
    structure_field: str | None = None  # the body field that asked for structured output


def first_failure(results: list[Result]) -> Result | None:
    return next((r for r in results if r.status == "error"), None)


def refuse_failed(results: list[Result], shape: BodyShape) -> None:
    """A prompt the engine refused (longer than core.max_context, a token id outside the vocabulary, a schema
    that does not compile or led nowhere) fails the whole call, as with OpenAI; the error names the body's field."""
    failed = first_failure(results)
    if failed is not None:
        raise answer_error(failed, shape)


def answer_error(failed: Result, shape: BodyShape) -> ApiError:
    """The error the route answers for a body one of whose questions failed (as OpenAI, the whole call fails)."""
    field = failed.error_field
    if field is None:
        return ApiError(500, f"the engine failed: {failed.error}", None, "server_error")
    if not field.startswith("queries["):  # a request-level option (the distributed worker's engine refused it)
        return ApiError.from_message(422, failed.error or f"{field}: invalid")
    return ApiError(400, f"{body_field(field, failed.index, shape)}: {_QUESTION_PREFIX.sub('', failed.error or '')}",
                    body_field(field, failed.index, shape))


def body_field(question_field: str, index: int, shape: BodyShape) -> str:
    """queries[3].structured_outputs -> response_format (or guided_regex, ...); queries[1] -> messages, prompt[0]."""
    if shape.structure_field is not None and ".structured_outputs" in question_field:
        return shape.structure_field
    if ".logit_bias" in question_field:
        return "logit_bias"
    field = "messages" if shape.kind == "chat" else "prompt" if shape.single_prompt else f"prompt[{index // shape.n}]"
    token = _TOKEN_INDEX.match(question_field)
    if token is not None and shape.kind == "text":
        field += f"[{token.group(1)}]"  # the position of the id outside the vocabulary
    return field
