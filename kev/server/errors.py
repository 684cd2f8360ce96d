"""The server's error handlers: every exception a route raises is answered in the one error shape
(kev/wire/bodies/errors.py: ApiError, error_body), and the OpenAPI entries for the errors a route can answer."""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kev.errors import describe_os_error
from kev.wire.bodies.api_models import ErrorResponse
from kev.wire.bodies.errors import ApiError, error_body, validation_error

log = logging.getLogger("kev.server")


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), err.status_code, err.headers)


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
