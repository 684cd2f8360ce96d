"""The Responses request body, as OpenAI spells it, and the chat completion body it means."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kev.wire.bodies.api_models import MAX_SEED, Temperature, Text
from kev.wire.bodies.errors import ApiError


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class TextFormat(_Body):
    type: Literal["text", "json_schema", "json_object"] = "text"
    name: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(_Body):
    format: TextFormat | None = None


class FunctionTool(_Body):
    type: Literal["function"]
    name: Text
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Body):
    type: Literal["function"]
    name: Text


class ResponsesBody(_Body):
    model: Text
    input: Text | list[dict[str, Any]] = Field(description="a text, or a list of input items (messages, "
                                               "function_call, function_call_output)")
    instructions: Text | None = None
    max_output_tokens: int | None = Field(None, ge=1, strict=False)  # JSON Schema integers include 8.0
    temperature: Temperature = None
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED, strict=False,
                             description="Kev's (as vLLM's): reproducible sampling")
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: Text | None = None
    store: bool = True
    stream: bool = False
    metadata: dict[str, str] | None = None

    def messages(self, earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The chat messages: the previous response's conversation, the instructions, then this input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        turns = [message for i, item in enumerate(items) for message in _chat_messages(item, i)]
        return system + [m for m in earlier if m["role"] != "system"] + turns

    def chat_body(self, earlier: list[dict[str, Any]]) -> dict[str, Any]:
        """The /v1/chat/completions body this request means (validated as one by the caller)."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages(earlier), "stream": self.stream}
        for key, value in (("max_tokens", self.max_output_tokens), ("temperature", self.temperature),
                           ("top_p", self.top_p), ("seed", self.seed),
                           ("parallel_tool_calls", self.parallel_tool_calls)):
            if value is not None:
                body[key] = value
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                             for t in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice if isinstance(self.tool_choice, str) else \
                {"type": "function", "function": {"name": self.tool_choice.name}}
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise ApiError(400, "text.format.schema: is required with type json_schema", "text.format.schema")
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}}
        return body


def _chat_messages(item: Any, index: int) -> list[dict[str, Any]]:
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise ApiError(400, f"{where}: must be an object (a message or a function call item)", where)
    kind = item.get("type", "message")
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise ApiError(400, f"{where}.{key}: must be a string", f"{where}.{key}")
        return [{"role": "assistant", "content": None, "tool_calls": [
            {"id": item["call_id"], "type": "function",
             "function": {"name": item["name"], "arguments": item["arguments"]}}]}]
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
            raise ApiError(400, f"{where}: a function_call_output needs call_id and output (strings)", where)
        return [{"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}]
    if kind != "message":
        raise ApiError(400, f"{where}.type: {kind!r} is not served here (message, function_call, "
                            "function_call_output)", f"{where}.type")
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise ApiError(400, f"{where}.role: must be user, assistant, system or developer", f"{where}.role")
    return [{"role": role, "content": _text(item.get("content"), where)}]


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}.content[{j}]: only text parts (input_text, output_text) are served",
                               f"{where}.content[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"{where}.content: must be a text or a non-empty list of text parts", f"{where}.content")
