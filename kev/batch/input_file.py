"""Read a batch input file into BatchLines: OpenAI Batch JSONL, plain JSONL ({"prompt"} / {"messages"}) or .txt.

Nothing here runs a model: every line is read and checked before any compute, and each
problem names its line (1-based) and field.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
URLS = (CHAT_URL, COMPLETIONS_URL)
_OPENAI_KEYS = {"custom_id", "method", "url", "body"}
Format = Literal["jsonl", "txt"]


@dataclass(frozen=True)
class BatchLine:
    line_no: int  # 1-based, in the input file
    custom_id: str
    url: str  # one of URLS
    body: dict[str, Any]  # the request body, as on the HTTP route


@dataclass
class LineError(Exception):
    line_no: int
    custom_id: str | None  # None when the line could not be read far enough to know it
    field: str | None
    message: str
    status_code: int = 400

    def __str__(self) -> str:
        return f"line {self.line_no}: " + (f"{self.field}: " if self.field else "") + self.message


def read_lines(lines: Iterable[str], fmt: Format) -> tuple[list[BatchLine], list[LineError]]:
    """Every request of the file, and every line that is not one. Blank lines are skipped."""
    read: list[BatchLine] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    for line_no, text in enumerate(lines, start=1):
        text = text.rstrip("\r\n")
        if not text.strip():
            continue
        try:
            line = _txt_line(text, line_no) if fmt == "txt" else _json_line(text, line_no)
        except LineError as err:
            errors.append(err)
            continue
        if line.custom_id in seen:
            errors.append(LineError(line_no, None, "custom_id",
                                    f"{line.custom_id!r} is a duplicate (first on line {seen[line.custom_id]})"))
            continue
        seen[line.custom_id] = line_no
        read.append(line)
    return read, errors


def _txt_line(text: str, line_no: int) -> BatchLine:
    return BatchLine(line_no, str(line_no), CHAT_URL, {"messages": [{"role": "user", "content": text}]})


def _json_line(text: str, line_no: int) -> BatchLine:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise _error(line_no, None, None, f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(data, dict):
        raise _error(line_no, None, None, f"must be a JSON object, got {type(data).__name__}")
    if {"url", "method", "body"} & set(data):
        return _openai_line(data, line_no)
    return _plain_line(data, line_no)


def _openai_line(data: dict[str, Any], line_no: int) -> BatchLine:
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _error(line_no, None, "custom_id", "is required (a non-empty string)")
    if unknown := sorted(set(data) - _OPENAI_KEYS):
        raise _error(line_no, custom_id, unknown[0], "unknown field (a line has custom_id, method, url and body)")
    if data.get("method") != "POST":
        raise _error(line_no, custom_id, "method", f"must be \"POST\", got {data.get('method')!r}")
    if data.get("url") not in URLS:
        raise _error(line_no, custom_id, "url", f"unknown url {data.get('url')!r} (one of {', '.join(URLS)})")
    if not isinstance(data.get("body"), dict):
        raise _error(line_no, custom_id, "body", "is required (a JSON object)")
    return BatchLine(line_no, custom_id, data["url"], data["body"])


def _plain_line(data: dict[str, Any], line_no: int) -> BatchLine:
    """{"prompt": ...} is a completion (no chat template), {"messages": [...]} a chat; other keys are body fields."""
    body = dict(data)
    custom_id = body.pop("custom_id", str(line_no))
    if not isinstance(custom_id, str) or not custom_id:
        raise _error(line_no, None, "custom_id", "must be a non-empty string")
    present = [key for key in ("prompt", "messages") if key in body]
    if len(present) != 1:
        raise _error(line_no, custom_id, None, "needs exactly one of prompt or messages (or the OpenAI Batch "
                                               "fields custom_id, method, url, body)")
    return BatchLine(line_no, custom_id, COMPLETIONS_URL if present[0] == "prompt" else CHAT_URL, body)


def _error(line_no: int, custom_id: str | None, field: str | None, message: str) -> LineError:
    return LineError(line_no, custom_id, field, message)
