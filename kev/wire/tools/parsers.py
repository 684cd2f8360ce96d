"""Model output into tool calls (vLLM's tool parsers, the two formats most models are trained on).

hermes (Hermes 2 Pro, Qwen 2.5 / 3, and Kev's generic prompt): text, then one or more
  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
llama3_json (Llama 3.1 / 3.2 / 3.3): the whole answer is {"name": "f", "parameters": {...}} (after an optional
  <|python_tag|>), several separated by "; ".
An answer that does not parse, or names a function that was not offered, stays text: never a guessed call.
An answer cut by max_tokens (cut=True) is read as OpenAI returns one: the complete calls parsed and the cut one with
its partial `arguments` text, when its name was written whole.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

HERMES_OPEN = "<tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
# A call object cut after its name: {"name": "f", "arguments": <partial arguments text>
_CUT_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
                       r'(?:\s*,\s*"(?:arguments|parameters)"\s*:\s*(.*)|[^{}"]*"?[a-z]*)\Z', re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON text


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: list[ParsedCall]


def parse(text: str, parser: str, names: set[str], cut: bool = False) -> Parsed:
    """The answer's text and calls under tool_choice auto."""
    calls = _hermes(text, names, cut) if parser == "hermes" else _llama3(text, names, cut)
    if calls is None:
        return Parsed(text, [])
    content = text[:text.find(HERMES_OPEN)] if parser == "hermes" else ""  # as vLLM: the text before, unstripped
    return Parsed(content if content.strip() else None, calls)


def parse_required(text: str, names: set[str], cut: bool = False) -> list[ParsedCall] | None:
    """The JSON array a `required` answer was generated as: [{"name", "parameters"}, ...]; None if cut short
    (unless cut: then the calls written so far, the last maybe partial)."""
    try:
        items = json.loads(text)
    except ValueError:
        return _cut_array(text, names) if cut else None
    calls = [_call(item, ("parameters", "arguments"), names) for item in items] if isinstance(items, list) else [None]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def _cut_array(text: str, names: set[str]) -> list[ParsedCall] | None:
    body = text.lstrip()
    if not body.startswith("["):
        return None
    return _objects(body, 1, names, ", \t\r\n]", cut=True) or None


def _objects(body: str, pos: int, names: set[str], separators: str, cut: bool) -> list[ParsedCall] | None:
    """JSON call objects one after another from pos; with cut the last one may be cut short (kept with its partial
    arguments when its name is whole). None when one is not a call of an offered function, or does not parse."""
    decoder, calls = json.JSONDecoder(), list[ParsedCall]()
    while True:
        while pos < len(body) and body[pos] in separators:
            pos += 1
        if pos >= len(body):
            return calls
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except ValueError:
            if not cut:
                return None
            partial = cut_call(body[pos:], names)
            return calls + [partial] if partial is not None else calls
        call = _call(obj, ("parameters", "arguments"), names)
        if call is None:
            return None
        calls.append(call)


def cut_call(text: str, names: set[str]) -> ParsedCall | None:
    """A call object cut short: its name (whole, offered) and the arguments text written so far."""
    match = _CUT_CALL.match(text)
    if match is None:
        return None
    try:
        name = json.loads(f'"{match.group(1)}"')
    except ValueError:
        return None
    return ParsedCall(name, (match.group(2) or "").rstrip()) if name in names else None


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


def _hermes(text: str, names: set[str], cut: bool = False) -> list[ParsedCall] | None:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return None
    blocks = list(_HERMES_BLOCK.finditer(text, start))
    calls = [_call(_json(m.group(1)), ("arguments", "parameters"), names) for m in blocks]
    if cut and calls and calls[-1] is None and not blocks[-1].group(0).rstrip().endswith("</tool_call>"):
        calls[-1] = cut_call(blocks[-1].group(1), names)  # the block the cut left open
        if calls[-1] is None:
            calls.pop()
    return None if not calls or any(c is None for c in calls) else [c for c in calls if c is not None]


def _llama3(text: str, names: set[str], cut: bool = False) -> list[ParsedCall] | None:
    return _objects(text.strip().removeprefix(_PYTHON_TAG).lstrip(), 0, names, " \t\r\n;", cut) or None


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
