"""Output lines in OpenAI's Batch output format:
{"id", "custom_id", "response": {status_code, request_id, body}, "error"}."""
from __future__ import annotations

import secrets
from typing import Any

from kev.results.result import Result
from kev.batch.input_file import LineError
from kev.batch.requests import BatchRequest
from kev.wire.answer_errors import answer_error, first_failure
from kev.wire.bodies.errors import error_body
from kev.model.tokenizer import Tokenizer


def answer_record(request: BatchRequest, request_id: str, results: list[Result], model: str,
                  tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The line for a finished request: the route's response body, or the route's error (a refused prompt: 400)."""
    failed = first_failure(results)
    if failed is not None:  # the route's own rule: the caller's input a 400 naming the body field, else a 500
        err = answer_error(failed, request.call.shape)
        return response_record(request.custom_id, err.status_code, err.body(), request_id)
    call = request.call
    reply = call.reply(model, lambda ids: tokenizer.decode(ids, skip_special_tokens=False) if tokenizer else "",
                       request_id)
    return response_record(request.custom_id, 200, reply.answer(results, call.keep).model_dump(), request_id)


def response_record(custom_id: str, status_code: int, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    return {"id": new_id(), "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body}, "error": None}


def invalid_record(err: LineError) -> dict[str, Any]:
    """A line refused before compute (kev batch --skip-invalid).

    An unreadable line has no custom_id: `line` says which."""
    if err.custom_id is None:
        return {"id": new_id(), "custom_id": None, "response": None,
                "error": {"code": "invalid_line", "message": str(err), "line": err.line_no}}
    if err.field is not None and err.field.startswith("body."):  # the body's own fault: as the route says it
        param = err.field.removeprefix("body.")
        return response_record(err.custom_id, err.status_code, error_body(err.status_code, f"{param}: {err.message}",
                                                                          param), None)
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
