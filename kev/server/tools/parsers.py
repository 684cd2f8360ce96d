"""Model output into tool calls (vLLM's tool parsers, the two formats most models are trained on).

hermes (Hermes 2 Pro, Qwen 2.5 / 3, and Kev's generic prompt): text, then one or more
  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
llama3_json (Llama 3.1 / 3.2 / 3.3): the whole answer is {"name": "f", "parameters": {...}} (after an optional
  <|python_tag|>), several separated by "; ".
An answer that does not parse, or names a function that was not offered, stays text: never a guessed call.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

HERMES_OPEN = "<tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON text


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: list[ParsedCall]


def parse(text: str, parser: str, names: set[str]) -> Parsed:
    """The answer's text and calls under tool_choice auto."""
    calls = _hermes(text, names) if parser == "hermes" else _llama3(text, names)
    if calls is None:
        return Parsed(text, [])
    content = text[:text.find(HERMES_OPEN)] if parser == "hermes" else ""  # as vLLM: the text before, unstripped
    return Parsed(content if content.strip() else None, calls)


def parse_required(text: str, names: set[str]) -> list[ParsedCall] | None:
    """The JSON array a `required` answer was generated as: [{"name", "parameters"}, ...]; None if cut short."""
    try:
        items = json.loads(text)
    except ValueError:
        return None
    calls = [_call(item, ("parameters", "arguments"), names) for item in items] if isinstance(items, list) else [None]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def may_start_call(text: str, parser: str) -> int | None:
    """Where a call begins (or may be beginning: a marker's first characters at the end), else None."""
    if parser == "llama3_json":
        stripped = text.lstrip()
        return 0 if stripped.startswith(("{", _PYTHON_TAG)) or not stripped else None
    at = text.find(HERMES_OPEN)
    if at >= 0:
        return at
    for k in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(HERMES_OPEN[:k]):
            return len(text) - k
    return None


def _hermes(text: str, names: set[str]) -> list[ParsedCall] | None:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return None
    calls = [_call(_json(m.group(1)), ("arguments", "parameters"), names)
             for m in _HERMES_BLOCK.finditer(text, start)]
    return None if not calls or any(c is None for c in calls) else [c for c in calls if c is not None]


def _llama3(text: str, names: set[str]) -> list[ParsedCall] | None:
    body = text.strip().removeprefix(_PYTHON_TAG).lstrip()
    decoder, pos, calls = json.JSONDecoder(), 0, []
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except ValueError:
            return None
        call = _call(obj, ("parameters", "arguments"), names)
        if call is None:
            return None
        calls.append(call)
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
    return calls or None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(obj: Any, keys: tuple[str, str], names: set[str]) -> ParsedCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments: Any = next((obj[k] for k in keys if k in obj), {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON text
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))
