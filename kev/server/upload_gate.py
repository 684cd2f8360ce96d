"""An upload's body passes the gate as it arrives, never held whole in memory.

The gate buffers an ordinary body to check it (UTF-8, integer sizes) before the route runs; an
upload (POST /v1/files, up to batch.max_file_bytes) instead streams through to the multipart
parser, which spools it to a temporary file, counted on the way: past the limit, or past the
body deadline, the route sees the client go away and the caller gets the 413 / 408 the gate
would have sent, never half an answer.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Refusal = tuple[int, str, dict[str, str] | None]  # status, message, extra headers
Refuse = Callable[[Scope, Receive, Send, int, str, str, dict[str, str] | None], Awaitable[None]]


@dataclass
class _Upload:
    received: int = 0
    started: bool = False  # the route began its answer
    refusal: Refusal | None = None


async def stream_upload(app: ASGIApp, scope: Scope, receive: Receive, send: Send, allowed: int, body_timeout_s: float,
                        too_large: Callable[[int], str], refuse: Refuse) -> None:
    """Run the route on a receive that counts the body; refuse (status, message) if it runs over."""
    deadline = time.monotonic() + body_timeout_s
    state = _Upload()

    async def counted() -> Message:
        if state.refusal is not None:
            return {"type": "http.disconnect"}
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):  # a client that stalls mid-body
                message = await receive()
        except TimeoutError:
            state.refusal = (408, f"body: not complete within server.body_timeout_s={body_timeout_s:g}",
                                {"Connection": "close"})
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            state.received += len(message.get("body", b""))
            if state.received > allowed:
                state.refusal = (413, too_large(state.received), None)
                return {"type": "http.disconnect"}
        return message

    async def guarded(message: Message) -> None:
        if state.refusal is not None:  # the route's answer to a body we cut short is replaced by the refusal
            return
        state.started = True
        await send(message)

    try:
        await app(scope, counted, guarded)
    except Exception:
        if state.refusal is None:
            raise
    if state.refusal is not None and not state.started:
        status, message, headers = state.refusal
        await refuse(scope, receive, send, status, message, "body", headers)
