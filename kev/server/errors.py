"""Every error the server sends has one shape: {"error": {"message", "type", "field", "param"}}.

`field` names what the caller got wrong (a JSON path such as "queries[2].text",
"body" or "Authorization"); `param` repeats it because the OpenAI client reads that key.
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kev.errors import describe_os_error
from kev.server.api_models import ErrorResponse

log = logging.getLogger("kev.server")

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


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), err.status_code, err.headers)


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


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(err))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException) -> JSONResponse:
        # Starlette's own errors (404 route, 405 method, 400 unparsable body).
        field = "body" if err.status_code == 400 else ("path" if err.status_code == 404 else "method")
        detail = err.detail if isinstance(err.detail, str) else json.dumps(err.detail)
        is_route = err.status_code in (404, 405)
        message = f"{request.method} {request.url.path}: {detail}" if is_route else f"body: {detail}"
        headers = getattr(err, "headers", None)
        if err.status_code == 405:  # Starlette names the methods of the first matching route only
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(app, request.url.path))}
        return error_response(ApiError(err.status_code, message, field, headers=headers))

    @app.exception_handler(OSError)
    async def _os_error(request: Request, err: OSError) -> JSONResponse:
        # a full disk, a read-only batch.dir, no file handles left: the resource is at fault, not the request
        message = describe_os_error(err)
        log.warning("%s %s: %s", request.method, request.url.path, message)
        return error_response(ApiError(503, message, headers={"Retry-After": "30"}))

    @app.exception_handler(Exception)
    async def _crash(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(err).__name__}", None), 500)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route serves at this path (GET /v1/requests/{id} and DELETE are two routes)."""
    methods: set[str] = set()
    for route in _leaf_routes(app.router.routes):
        if route.path_regex.match(path):
            methods |= route.methods or set()
    return sorted(methods)


def _leaf_routes(routes: list[Any]) -> Iterator[Any]:
    for route in routes:
        inner = getattr(getattr(route, "original_router", None), "routes", None) or getattr(route, "routes", None)
        if inner is not None:
            yield from _leaf_routes(inner)
        elif hasattr(route, "path_regex"):
            yield route


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the errors a route can answer (all share ErrorResponse)."""
    # 422 is a request the schema refuses; 400 one it accepts whose content cannot be served as asked.
    described = {400: "malformed JSON or invalid UTF-8, or content that cannot be served as asked: a grammar, regex or "
                      "JSON schema that does not compile or leads nowhere, a prompt longer than the context, tools "
                      "that do not resolve", 401: "missing or wrong API key",
                 404: "unknown request or model", 413: "over a size limit (body, questions, characters)",
                 422: "a field is invalid; `field` names it", 429: "over capacity; retry after Retry-After seconds",
                 503: "model loading, shutting down or wait timeout"}
    return {code: {"model": ErrorResponse, "description": described.get(code, "error")} for code in codes}
