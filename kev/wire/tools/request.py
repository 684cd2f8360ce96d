"""A chat body with tools (or a tool-call history) into what the engine runs: the rendered prompt, the grammar of a
forced call, and the ToolReply that shapes the answers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jinja2

from kev.model.tokenizer import Tokenizer
from kev.wire.bodies.errors import ApiError
from kev.wire.bodies.openai_models import ChatCompletionBody
from kev.wire.tools.forced import named_schema, named_tool, required_schema
from kev.wire.tools.prompt import Parser, render
from kev.wire.tools.reply import Mode, ToolReply
from kev.wire.bodies.tool_schema import NamedToolChoice


@dataclass(frozen=True)
class ToolRequest:
    prompt: str  # the rendered prompt, submitted as is (the template already applied)
    structure: dict[str, Any] | None  # a forced call's grammar, as structured_outputs
    reply: ToolReply


def tool_request(body: ChatCompletionBody, tokenizer: Tokenizer, parser: Parser, system: str | None) -> ToolRequest:
    """system: the operator's system prompt (isolation.system_prompt), put first when the caller sent none."""
    tools = body.tools or []
    names = {t.function.name for t in tools}
    if len(names) < len(tools):
        raise ApiError(400, "tools: two tools have the same function name", "tools")
    choice = body.tool_choice or ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise ApiError(400, f"tool_choice: {_said(choice)} needs tools", "tool_choice")
    mode: Mode = "named" if isinstance(choice, NamedToolChoice) else choice
    structure, named = None, None
    if isinstance(choice, NamedToolChoice):
        tool = named_tool(tools, choice)
        named, structure = tool.function.name, named_schema(tool, tools.index(tool))
    elif choice == "required":
        structure = required_schema(tools, body.parallel_tool_calls is not False)
    _check_combinations(body, mode, structure)
    messages = [_message(m) for m in body.messages]
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    try:
        prompt = render(tokenizer, messages, tools if mode != "none" else [], parser)
    except jinja2.TemplateError as err:
        raise ApiError(400, f"messages: the model's chat template refused them: {err}", "messages") from None
    return ToolRequest(prompt.text, structure,
                    ToolReply(mode, parser, names, prompt.kind, named, parallel=body.parallel_tool_calls is not False))


def _check_combinations(body: ChatCompletionBody, mode: Mode, structure: dict[str, Any] | None) -> None:
    field = body.structure()[0]
    if structure is not None and field is not None:
        raise ApiError(422, f"{field}: cannot be combined with tool_choice {mode} (a forced call has its own "
                            "grammar)", field)
    if body.logprobs and body.stream and mode != "none":
        raise ApiError(400, "logprobs: not supported together with tools when streaming", "logprobs")


def _message(message: Any) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    return {"role": role, "content": None if message.content is None else message.text, "name": message.name,
            "tool_calls": message.tool_calls, "tool_call_id": message.tool_call_id}


def _said(choice: Any) -> str:
    return f"function {choice.function.name!r}" if isinstance(choice, NamedToolChoice) else repr(choice)
