"""Two ASGI layers in front of every route: the gate (API key -> caller, body size, UTF-8) and HTTP request counting.

They are plain ASGI (not BaseHTTPMiddleware) so streaming responses and client
disconnects pass through untouched.
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kev.wire.bodies.errors import error_body
from kev.backend.metrics import ServerMetrics
from kev.server.playground import PAGE_PATHS
from kev.config.tenants import Tenants
from kev.server.upload_gate import stream_upload

# Liveness and readiness probes carry no key (/health, as in vLLM and llama.cpp); nor does loading the
# playground page, which holds no secret (its API calls do).
OPEN_PATHS = frozenset({"/healthz", "/health", *PAGE_PATHS})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
UPLOAD_ENVELOPE = 64 << 10  # multipart boundaries and part headers around an uploaded file


class GateMiddleware:
    def __init__(self, app: ASGIApp, tenants: Tenants, max_body_bytes: int, body_timeout_s: float = 30.0,
                 path_limits: dict[str, tuple[int, str]] | None = None) -> None:
        """path_limits: path -> (limit, the config key it comes from) for uploads: their body may hold that many
        bytes of file plus UPLOAD_ENVELOPE of multipart framing (the route checks the file's own size); it streams
        through to the route (kev/server/upload_gate.py) instead of being read here."""
        self.app, self.max_body_bytes, self.body_timeout_s = app, max_body_bytes, body_timeout_s
        self.path_limits = path_limits or {}
        self.tenants = tenants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # the server's own start and stop: no caller
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        if scope["type"] == "http" and _count(scope, b"authorization") > 1:
            # which one counts is where a proxy that checked the first and Kev would disagree: neither
            return await _refuse(scope, receive, send, 400, "Authorization: sent more than once; send one "
                                 "'Bearer KEY' header", "Authorization")
        caller = self.tenants.caller(headers.get("authorization", "")) if _count(scope, b"authorization") < 2 else None
        if caller is not None:  # the routes read it: which tenant's requests, files and batches
            scope["state"] = {**scope.get("state", {}), "caller": caller}
        if scope["type"] != "http":  # a websocket, or any scope type a later server brings: the key or nothing
            return await self._other_scope(scope, receive, send, caller is not None)
        if caller is None and scope["path"] not in OPEN_PATHS:
            return await _refuse(scope, receive, send, 401,
                                 "Authorization: missing or wrong API key (use 'Bearer KEY')", "Authorization",
                                 {"WWW-Authenticate": "Bearer"})
        if scope["method"] not in _BODY_METHODS:
            return await self.app(scope, receive, send)
        limit, key = self.path_limits.get(scope["path"], (self.max_body_bytes, "server.max_body_bytes"))
        allowed = limit + (UPLOAD_ENVELOPE if scope["path"] in self.path_limits else 0)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > allowed:
            return await _refuse(scope, receive, send, 413, _too_large(int(declared), limit, key), "body")
        if scope["path"] in self.path_limits:
            return await stream_upload(self.app, scope, receive, send, allowed, self.body_timeout_s,
                                       lambda size: _too_large(size, limit, key), _refuse)
        body = bytearray()
        more = True
        try:
            async with asyncio.timeout(self.body_timeout_s):  # a client that stalls mid-body
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    more = message.get("more_body", False)
                    if len(body) > allowed:
                        return await _refuse(scope, receive, send, 413, _too_large(len(body), limit, key), "body")
        except TimeoutError:
            return await _refuse(scope, receive, send, 408, f"body: not complete within server.body_timeout_s="
                                 f"{self.body_timeout_s:g}", "body", {"Connection": "close"})
        if _is_json(headers) and not _is_utf8(bytes(body)):
            return await _refuse(scope, receive, send, 400, "body: is not valid UTF-8", "body")
        if _is_json(headers) and (huge := huge_integer(bytes(body))) is not None:
            path, digits = huge
            return await _refuse(scope, receive, send, 422, f"{path}: an integer of {digits} digits is out of range",
                                 path)
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _other_scope(self, scope: Scope, receive: Receive, send: Send, authorized: bool) -> None:
        if scope["type"] == "websocket":
            if authorized:
                return await self.app(scope, receive, send)
            await receive()  # websocket.connect; closing before accepting answers the handshake with 403
            return await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"})
        if authorized:
            return await self.app(scope, receive, send)
        return None  # an unknown scope type without the key: nothing of the app runs


class HttpMetricsMiddleware:
    """Counts answered HTTP requests by route template (not raw path, which would explode the label set)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [0]

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.http_requests.labels(route, scope["method"], str(status[0] or 499)).inc()


def _too_large(size: int, limit: int, key: str) -> str:
    return f"body: {size} bytes; the limit is {key}={limit}"


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _count(scope: Scope, name: bytes) -> int:
    return sum(1 for k, _ in scope.get("headers", []) if k.lower() == name)


def _is_json(headers: dict[str, str]) -> bool:
    content_type = headers.get("content-type", "application/json").split(";")[0].strip().lower()
    return content_type == "application/json" or content_type.endswith("+json")


class _Huge:
    def __init__(self, digits: int) -> None:
        self.digits = digits


def huge_integer(body: bytes) -> tuple[str, int] | None:
    """(JSON path, digits) of the first integer too long for Python's JSON parser, which would otherwise
    refuse the whole body without naming the field; None if there is none (or the JSON is broken anyway)."""
    limit = sys.get_int_max_str_digits() or 0
    if not limit or not re.search(rb"\d{%d}" % (limit + 1), body):
        return None
    try:
        value = json.loads(body, parse_int=lambda s: _Huge(len(s.lstrip("-"))) if len(s) > limit else int(s))
    except ValueError:
        return None
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop(0)
        if isinstance(item, _Huge):
            return path or "body", item.digits
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        stack += [(f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else k), v) for k, v in children]
    return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app reads the body we already read; later receives (disconnect) go to the client."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, message: str, field: str,
                  headers: dict[str, Any] | None = None) -> None:
    await JSONResponse(error_body(status, message, field), status, headers)(scope, receive, send)
