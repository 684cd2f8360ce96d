"""Server-Sent Events framing: one `event:`/`data:` block per message, JSON on one line."""
from __future__ import annotations

import json
from typing import Any

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# OpenAPI 3.1: a text/event-stream schema describes one event.
_EVENT_SCHEMA = {"type": "object", "required": ["data"],
                 "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"}}}
SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "JSON, or Server-Sent Events when the body asks to stream",
          "content": {"text/event-stream": {"schema": _EVENT_SCHEMA}}}}


def sse(data: Any, event: str | None = None) -> str:
    """json.dumps escapes newlines, so the data always fits on the one line SSE requires."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
