"""Tools and tool-call histories into prompt text.

Through the model's own chat template when it has a tools slot (found as llama.cpp's server finds it: a probe tool
rendered through the template shows up in the text). Otherwise (the default model's template has none) through
Kev's generic format ("kev_generic"): the tools' JSON schemas and the call shape the --tool-call-parser reads are
stated in the system message; earlier calls are written back in that shape and tool results come back as user
turns in <tool_response> blocks. Which one a model gets is logged once and named in every response
(`tool_prompt`) and in /v1/models.
"""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from kev.model.tokenizer import Tokenizer
from kev.wire.bodies.tool_schema import ToolCallIn, ToolDef

log = logging.getLogger("kev.server")
PromptKind = Literal["chat_template", "kev_generic"]
Parser = Literal["hermes", "llama3_json"]
_PROBE = {"type": "function", "function": {"name": "kev_probe_tool", "description": "probe",
                                           "parameters": {"type": "object", "properties": {}}}}

CALL_SHAPES: dict[str, str] = {
    "hermes": ("To call functions, answer with one <tool_call></tool_call> block per call, each holding a JSON "
               "object with the function's name and arguments:\n<tool_call>\n"
               '{"name": "<function-name>", "arguments": <arguments-json-object>}\n</tool_call>'),
    "llama3_json": ('To call a function, answer with only a JSON object: {"name": "<function-name>", '
                    '"parameters": <arguments-json-object>} (several calls: separate the objects with "; ").'),
}


@dataclass(frozen=True)
class ToolPrompt:
    text: str
    kind: PromptKind


@functools.lru_cache(maxsize=8)
def prompt_kind(tokenizer: Tokenizer) -> PromptKind:
    """chat_template when the template renders tools, else kev_generic; logged once per tokenizer."""
    try:
        rendered = tokenizer.render_chat([{"role": "user", "content": "hi"}], tools=[_PROBE]) \
            if tokenizer.has_chat_template else ""
    except Exception:  # a template that refuses the probe has no usable tools slot
        rendered = ""
    kind: PromptKind = "chat_template" if "kev_probe_tool" in rendered else "kev_generic"
    if kind == "kev_generic":
        log.info("tools: the chat template has no tools slot; tools are stated in the system message in Kev's "
                 "generic format (tool_prompt: kev_generic, docs/http-api.md#tool-calling)")
    else:
        log.info("tools: rendered through the model's chat template (tool_prompt: chat_template)")
    return kind


def render(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[ToolDef], parser: Parser) -> ToolPrompt:
    """messages: OpenAI messages (role, content, tool_calls, tool_call_id) as dicts; tools: those the model is
    offered (none: a history with tool turns only)."""
    kind = prompt_kind(tokenizer)
    schemas = [t.model_dump(exclude_none=True) for t in tools]
    if kind == "chat_template":
        turns = [_template_turn(m) for m in messages]
        return ToolPrompt(tokenizer.render_chat(turns, tools=schemas or None), kind)
    turns = [_generic_turn(m, parser) for m in messages]
    if schemas:
        turns = _with_system(turns, generic_system_text(schemas, parser))
    if not tokenizer.has_chat_template:  # as the engine renders messages without a template
        return ToolPrompt("\n".join(t["content"] for t in turns), kind)
    return ToolPrompt(tokenizer.render_chat(turns), kind)


def generic_system_text(schemas: list[dict[str, Any]], parser: Parser) -> str:
    listed = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (f"You may call functions to help answer. The functions, as JSON schemas:\n<tools>\n{listed}\n</tools>\n"
            f"{CALL_SHAPES[parser]}\nWhen no function is needed, answer directly.")


def _with_system(turns: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": f"{turns[0]['content']}\n\n{text}"}, *turns[1:]]
    return [{"role": "system", "content": text}, *turns]


def _template_turn(message: dict[str, Any]) -> dict[str, Any]:
    """HF's message shape: tool-call arguments as objects (what templates `tojson`), when they parse."""
    turn = {k: v for k, v in message.items() if k in ("role", "content", "name", "tool_call_id") and v is not None}
    turn.setdefault("content", "")
    if message.get("tool_calls"):
        turn["tool_calls"] = [{"id": c.id, "type": "function",
                               "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                              for c in message["tool_calls"]]
    return turn


def _generic_turn(message: dict[str, Any], parser: Parser) -> dict[str, Any]:
    content = message.get("content") or ""
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls: list[ToolCallIn] = message.get("tool_calls") or []
    if calls:
        written = ("\n" if parser == "hermes" else "; ").join(
            format_call(c.function.name, _arguments(c.function.arguments), parser) for c in calls)
        content = f"{content}\n{written}" if content else written
    return {"role": message["role"], "content": content}


def format_call(name: str, arguments: Any, parser: Parser) -> str:
    """A call written as the parser reads it (and as the generic system message asks the model to write it)."""
    if parser == "hermes":
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + \
            "\n</tool_call>"
    return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
