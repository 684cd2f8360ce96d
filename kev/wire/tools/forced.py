"""The grammar a forced call is generated under (tool_choice `required` or a named function), as vLLM does it.

named: the answer is the function's arguments, a JSON value its `parameters` schema accepts;
required: the answer is a JSON array of {"name": <an offered function>, "parameters": <its arguments>}, at least one
(exactly one with parallel_tool_calls false).
Either is an ordinary structured_outputs {"json": schema}: compiled by llguidance when the question is submitted
and enforced in that question's channel only (kev/engine/structured.py), neighbours untouched.

A tool's schema may refer to its own parts (`$ref: "#/$defs/Item"`, `"#"` for recursion), as every nested pydantic
model does. Under `required` each schema sits inside the array's grammar, where those pointers would resolve against
the array: so each tool's schema moves whole under the grammar's `$defs` (as `tool<i>`) and its local pointers are
rewritten to point into it. Each tool's schema is checked alone first, so a keyword llguidance cannot enforce is a
400 naming that tool and the keyword, never a silently looser grammar.
"""
from __future__ import annotations

from typing import Any

import llguidance

from kev.wire.bodies.errors import ApiError
from kev.wire.bodies.tool_schema import NamedToolChoice, ToolDef

# llguidance's work limits for checking one tool's schema (the engine compiles the whole grammar again, timed).
_CHECK_LIMITS: dict[str, Any] = {"initial_lexer_fuel": 2_000_000, "max_grammar_size": 500_000}


def named_tool(tools: list[ToolDef], choice: NamedToolChoice) -> ToolDef:
    tool = next((t for t in tools if t.function.name == choice.function.name), None)
    if tool is None:
        offered = ", ".join(t.function.name for t in tools) or "none"
        raise ApiError(400, f"tool_choice.function.name: {choice.function.name!r} is not one of the tools "
                            f"({offered})", "tool_choice.function.name")
    return tool


def named_schema(tool: ToolDef, index: int = 0) -> dict[str, Any]:
    check_schema(tool, index)
    return {"json": tool.function.parameters_schema}


def required_schema(tools: list[ToolDef], parallel: bool) -> dict[str, Any]:
    for i, tool in enumerate(tools):
        check_schema(tool, i)
    defs = {f"tool{i}": rebase(t.function.parameters_schema, f"/$defs/tool{i}") for i, t in enumerate(tools)}
    calls = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                               "parameters": {"$ref": f"#/$defs/tool{i}"}},
              "required": ["name", "parameters"], "additionalProperties": False} for i, t in enumerate(tools)]
    array: dict[str, Any] = {"$defs": defs, "type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        array["maxItems"] = 1
    return {"json": array}


def rebase(schema: Any, base: str) -> Any:
    """A copy of schema with every local `$ref` ("#", "#/...") pointing under base (a JSON pointer)."""
    if isinstance(schema, list):
        return [rebase(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: rebase(value, base) for key, value in schema.items() if key != "$ref"}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = "#" + base + ref[1:]
    elif "$ref" in schema:
        out["$ref"] = ref
    return out


def check_schema(tool: ToolDef, index: int) -> None:
    """A 400 naming the tool when llguidance cannot enforce its schema (an unimplemented keyword, a remote or
    dangling $ref, an unknown format)."""
    where = f"tools[{index}].function.parameters"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(tool.function.parameters_schema,
                                                                defaults={"whitespace_flexible": False})
        problem = llguidance.LLMatcher.validate_grammar(grammar, limits=llguidance.LLParserLimits(**_CHECK_LIMITS))
    except (ValueError, TypeError) as err:
        problem = str(err)
    if problem:
        reason = problem.strip().splitlines()[0]
        raise ApiError(400, f"{where}: the schema of tool {tool.function.name!r} cannot be enforced as a grammar: "
                            f"{reason}", where)
