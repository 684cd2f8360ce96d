"""Server-Sent Events framing: one `event:`/`data:` block per message, JSON on one line."""
from __future__ import annotations

import json
from typing import Any

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: Any, event: str | None = None) -> str:
    """json.dumps escapes newlines, so the data always fits on the one line SSE requires."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
