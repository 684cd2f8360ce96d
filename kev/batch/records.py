"""Output lines in OpenAI's Batch output format:
{"id", "custom_id", "response": {status_code, request_id, body}, "error"}."""
from __future__ import annotations

import dataclasses
import re
import time
import secrets
from typing import Any

from kev.aggregator.result import Result
from kev.batch.input_file import LineError
from kev.batch.requests import BatchRequest
from kev.server.errors import error_body
from kev.model.tokenizer import Tokenizer
from kev.server.openai_format import Reply, best_of

_QUESTION_PREFIX = re.compile(r"^queries\[\d+\][^:]*: ")


def answer_record(request: BatchRequest, request_id: str, results: list[Result], model: str,
                  tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The line for a finished request: the route's response body, or the route's error (a refused prompt: 400)."""
    failed = next((r for r in results if r.status == "error"), None)
    if failed is not None:
        if failed.started_at is None and (failed.error or "").startswith("queries["):  # refused at submit
            field, message = _refused_field(request, failed)
            return response_record(request.custom_id, 400, error_body(400, f"{field}: {message}", field), request_id)
        return response_record(request.custom_id, 500, error_body(500, f"the engine failed: {failed.error}", None),
                               request_id)
    prefix = "chatcmpl-" if request.kind == "chat" else "cmpl-"
    echo = None if request.echo is None else tuple(
        p if isinstance(p, str) else (tokenizer.decode(p, skip_special_tokens=False) if tokenizer else "")
        for p in request.echo)
    reply = Reply(request.kind, prefix + request_id, int(time.time()), model, request.n, request.logprobs, echo)
    usage = reply.usage(results)  # every candidate's tokens count, as OpenAI bills best_of
    if request.keep < request.n:
        results, reply = best_of(results, request.n, request.keep), dataclasses.replace(reply, n=request.keep)
    return response_record(request.custom_id, 200, reply.response(results, usage).model_dump(), request_id)


def _refused_field(request: BatchRequest, failed: Result) -> tuple[str, str]:
    """The body field a prompt refused at submit is about, and the message without the engine's prefix
    (as the route says it)."""
    error = failed.error or "invalid"
    head = error.split(":", 1)[0]
    field = "messages" if request.kind == "chat" else "prompt" if request.single_prompt else \
        f"prompt[{failed.index // request.n}]"
    if request.structure_field is not None and ".structured_outputs" in head:
        field = request.structure_field
    elif ".logit_bias" in head:
        field = "logit_bias"
    return field, _QUESTION_PREFIX.sub("", error)


def response_record(custom_id: str, status_code: int, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    return {"id": new_id(), "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body}, "error": None}


def invalid_record(err: LineError) -> dict[str, Any]:
    """A line refused before compute (kev batch --skip-invalid).

    An unreadable line has no custom_id: `line` says which."""
    if err.custom_id is None:
        return {"id": new_id(), "custom_id": None, "response": None,
                "error": {"code": "invalid_line", "message": str(err), "line": err.line_no}}
    return response_record(err.custom_id, err.status_code, error_body(err.status_code, str(err), err.field), None)


def record_key(record: dict[str, Any]) -> str | None:
    """What marks a line as done on resume: its custom_id, or the line number of an unreadable line."""
    if isinstance(record.get("custom_id"), str):
        return record["custom_id"]
    error = record.get("error")
    if isinstance(error, dict) and isinstance(error.get("line"), int):
        return line_key(error["line"])
    return None


def line_key(line_no: int) -> str:
    return f"\0line {line_no}"  # cannot collide with a custom_id read from JSON text of a line


def error_key(err: LineError) -> str:
    return err.custom_id if err.custom_id is not None else line_key(err.line_no)


def is_failure(record: dict[str, Any]) -> bool:
    return record.get("error") is not None or (record.get("response") or {}).get("status_code") != 200


def usage_of(record: dict[str, Any]) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) of a 200 line."""
    usage = ((record.get("response") or {}).get("body") or {}).get("usage") or {}
    return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


def new_id() -> str:
    return "batch_req_" + secrets.token_hex(16)
