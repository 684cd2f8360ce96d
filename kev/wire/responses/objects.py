"""Kev's chat answers in the Responses API's shapes: the Response object, and its stream events made from the chat
stream's chunks (the same deltas /v1/chat/completions streams, so both routes say the same thing)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from kev.wire.responses.body import ResponsesBody


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def usage_of(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},  # both required by OpenAI's schema
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"]}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text or
            status == "completed" else []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message's text and calls as Responses output items."""
    items = [message_item(new_id("msg"), message["content"])] if message.get("content") else []
    items += [call_item(new_id("fc"), call["id"], call["function"]["name"], call["function"]["arguments"])
              for call in message.get("tool_calls") or []]
    return items or [message_item(new_id("msg"), "")]


def status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason in ("timeout", "cancelled"):  # Kev's own reasons: cut short from outside
        return "incomplete", None
    return "completed", None


def response_object(response_id: str, body: ResponsesBody, created: int, model: str, output: list[dict[str, Any]],
                    status: str, incomplete: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any]:
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    text_format: dict[str, Any] = {"type": "text"} if fmt is None or fmt.type == "text" else \
        {"type": "json_object"} if fmt.type == "json_object" else \
        {"type": "json_schema", "name": fmt.name or "response", "schema": fmt.schema_ or {}, "strict": fmt.strict}
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if body.tools else "none")
    return {
        "id": response_id, "object": "response", "created_at": created, "status": status, "error": None,
        "incomplete_details": incomplete, "instructions": body.instructions, "max_output_tokens":
        body.max_output_tokens, "model": model, "output": output,
        "output_text": "".join(part["text"] for item in output if item["type"] == "message"
                               for part in item["content"]),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id, "reasoning": None, "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p, "text": {"format": text_format},
        "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
        "tools": [{**t.model_dump(exclude_none=True), "parameters": t.parameters or {"type": "object"},
                   "strict": bool(t.strict)} for t in body.tools or []],
        "truncation": "disabled", "metadata": body.metadata or {},
        **({} if usage is None else {"usage": usage})}  # OpenAI's schema: usage is an object when present, never null


@dataclass
class _Call:
    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: str = ""


@dataclass
class EventStream:
    """Chat stream chunks (one choice) in, Responses stream events out, numbered in order."""

    opened: dict[str, Any]  # the Response object as created (status in_progress, no output)
    sequence: int = 0
    text: str = ""
    message_id: str | None = None
    message_index: int = -1
    calls: dict[int, _Call] = field(default_factory=dict)
    output: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def opening(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self.opened),
                self._event("response.in_progress", response=self.opened)]

    def chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return events

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self.message_id is None:
            self.message_id, self.message_index = new_id("msg"), len(self.output)
            self.output.append({})  # its place, filled when done
            events += [self._event("response.output_item.added", output_index=self.message_index,
                                   item=message_item(self.message_id, "", "in_progress")),
                       self._event("response.content_part.added", item_id=self.message_id,
                                   output_index=self.message_index, content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]
        self.text += text
        return events + [self._event("response.output_text.delta", item_id=self.message_id,
                                     output_index=self.message_index, content_index=0, delta=text, logprobs=[])]

    def _call(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        index, function = delta["index"], delta.get("function") or {}
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = _Call(new_id("fc"), delta.get("id") or new_id("call"),
                                             function.get("name") or "", len(self.output))
            self.output.append({})
            events.append(self._event("response.output_item.added", output_index=call.output_index,
                                      item=call_item(call.item_id, call.call_id, call.name, "", "in_progress")))
        if function.get("arguments"):
            call.arguments += function["arguments"]
            events.append(self._event("response.function_call_arguments.delta", item_id=call.item_id,
                                      output_index=call.output_index, delta=function["arguments"]))
        return events

    def closing(self) -> list[dict[str, Any]]:
        """The done events of every open item (the output then complete)."""
        events = []
        if self.message_id is not None:
            done = message_item(self.message_id, self.text)
            self.output[self.message_index] = done
            events += [self._event("response.output_text.done", item_id=self.message_id,
                                   output_index=self.message_index, content_index=0, text=self.text, logprobs=[]),
                       self._event("response.content_part.done", item_id=self.message_id,
                                   output_index=self.message_index, content_index=0, part=done["content"][0]),
                       self._event("response.output_item.done", output_index=self.message_index, item=done)]
        for call in self.calls.values():
            done = call_item(call.item_id, call.call_id, call.name, call.arguments)
            self.output[call.output_index] = done
            events += [self._event("response.function_call_arguments.done", item_id=call.item_id, name=call.name,
                                   output_index=call.output_index, arguments=call.arguments),
                       self._event("response.output_item.done", output_index=call.output_index, item=done)]
        if not self.output:
            self.output.append(message_item(new_id("msg"), ""))
        return events

    def finished(self, response: dict[str, Any]) -> dict[str, Any]:
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return self._event(kind, response=response)

    def error(self, body: dict[str, Any]) -> dict[str, Any]:
        error = body.get("error") or {}
        return self._event("error", code=error.get("code"), message=error.get("message", ""),
                           param=error.get("param"))
