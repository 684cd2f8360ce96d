"""The grammar a forced call is generated under (tool_choice `required` or a named function), as vLLM does it.

named: the answer is the function's arguments, a JSON value its `parameters` schema accepts;
required: the answer is a JSON array of {"name": <an offered function>, "parameters": <its arguments>}, at least one
(exactly one with parallel_tool_calls false).
Either is an ordinary structured_outputs {"json": schema}: compiled by llguidance when the question is submitted
and enforced in that question's channel only (kev/engine/structured.py), neighbours untouched.
"""
from __future__ import annotations

from typing import Any

from kev.server.errors import ApiError
from kev.server.tools.schema import NamedToolChoice, ToolDef


def named_tool(tools: list[ToolDef], choice: NamedToolChoice) -> ToolDef:
    tool = next((t for t in tools if t.function.name == choice.function.name), None)
    if tool is None:
        offered = ", ".join(t.function.name for t in tools) or "none"
        raise ApiError(400, f"tool_choice.function.name: {choice.function.name!r} is not one of the tools "
                            f"({offered})", "tool_choice.function.name")
    return tool


def named_schema(tool: ToolDef) -> dict[str, Any]:
    return {"json": tool.function.parameters_schema}


def required_schema(tools: list[ToolDef], parallel: bool) -> dict[str, Any]:
    calls = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                               "parameters": t.function.parameters_schema},
              "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        array["maxItems"] = 1
    return {"json": array}
