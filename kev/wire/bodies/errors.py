"""Every error the server sends has one shape: {"error": {"message", "type", "field", "param"}}.

`field` names what the caller got wrong (a JSON path such as "queries[2].text",
"body" or "Authorization"); `param` repeats it because the OpenAI client reads that key.
"""
from __future__ import annotations

import re
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

# The engine's InvalidRequestError messages start with the field they are about ("max_tokens: ...").
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")
# Union branch labels pydantic puts in an error's location; they are not part of the caller's JSON path.
UNION_TAGS = frozenset({"as_string", "as_messages", "as_object", "str", "int", "float", "bool", "list", "dict"})
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 408: "timeout", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large", 415: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


class ApiError(HTTPException):
    """An error answered to the caller; the status says whose fault, `field` says where."""

    def __init__(self, status_code: int, message: str, field: str | None = None, error_type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code, message, headers)
        self.message, self.field = message, field
        self.error_type = error_type or _TYPES.get(status_code, "server_error")

    def body(self) -> dict[str, Any]:
        """The JSON body this error answers (also a batch line's, and a stream's error event)."""
        return error_body(self.status_code, self.message, self.field, self.error_type)

    @classmethod
    def from_message(cls, status_code: int, message: str, **kwargs: Any) -> ApiError:
        """For engine messages that begin with their field name."""
        match = _FIELD_PREFIX.match(message)
        return cls(status_code, message, match.group(1) if match else None, **kwargs)


def error_body(status_code: int, message: str, field: str | None, error_type: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type or _TYPES.get(status_code, "server_error"),
                      "field": field, "param": field, "code": None}}  # code: OpenAI's required, nullable key


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """('body', 'queries', 0, 'as_object', 'text') -> 'queries[0].text'."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    path = ""
    for i, part in enumerate(parts):  # the first is a field's own name (a form's "expires_after[seconds]" too)
        if i > 0 and isinstance(part, str) and (part in UNION_TAGS or not part.isidentifier()):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def validation_error(err: RequestValidationError) -> ApiError:
    """The most specific pydantic problem (the deepest location) becomes one error naming its field."""
    problems = err.errors()
    if not problems:
        return ApiError(422, "body: invalid request", "body")
    # The deepest problem; at equal depth a rule the value broke beats a union branch whose type it is not
    # (10,000 stop strings: "at most 16 items", not "should be a valid string").
    problem = max(problems, key=lambda p: (len(p.get("loc", ())), not str(p.get("type", "")).endswith("_type")))
    if problem.get("type") == "json_invalid":
        detail = problem.get("ctx", {}).get("error", "malformed JSON")
        return ApiError(400, f"body: malformed JSON ({detail})", "body")
    field = field_path(problem.get("loc", ()))
    message = str(problem.get("msg", "invalid value")).removeprefix("Value error, ")
    if problem.get("type") == "missing":
        message = "is required"
    elif problem.get("type") in ("model_attributes_type", "dict_type") and field == "body":
        message = "must be a JSON object"
    elif problem.get("type") == "extra_forbidden":
        message = "unknown field"
    return ApiError(422, f"{field}: {message}", field)
