"""Answers into OpenAI's tool-call shapes: message.tool_calls and finish_reason tool_calls, and the stream deltas
the openai client accumulates ({"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}).

Streaming, per choice: with `auto`, text streams as content until a call may be starting (parsers.may_start_call);
from there it is held and parsed when the answer ends (a held text that is no call after all is sent as content).
A named call streams its arguments as they are generated; a `required` answer (one JSON array) is sent whole.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from kev.wire.bodies.openai_models import ChatChoice, ChatMessageOut
from kev.wire.tools.parsers import Parsed, ParsedCall, may_start_call, parse, parse_required
from kev.wire.tools.prompt import PromptKind
from kev.wire.bodies.tool_schema import ToolCallOut

Mode = Literal["none", "auto", "required", "named"]


@dataclass
class _ChoiceText:
    text: str = ""
    emitted: int = 0  # text[:emitted] went out as content
    announced: bool = False  # named: the call's id and name went out


@dataclass
class ToolReply:
    mode: Mode
    parser: str
    names: set[str]
    prompt_kind: PromptKind
    named: str | None = None
    parallel: bool = True  # parallel_tool_calls: false keeps an auto answer's first call only
    _choices: dict[int, _ChoiceText] = field(default_factory=dict)

    def parsed(self, text: str, cut: bool = False) -> Parsed:
        """cut: the answer hit max_tokens (its last call may be partial: kept, as OpenAI returns it)."""
        if self.mode == "named" and self.named is not None:
            return Parsed(None, [ParsedCall(self.named, text)])
        if self.mode == "required":  # its grammar already holds it to one call without parallel_tool_calls
            calls = parse_required(text, self.names, cut)
            return Parsed(None, calls) if calls else Parsed(text, [])
        parsed = parse(text, self.parser, self.names, cut) if self.mode == "auto" else Parsed(text, [])
        return parsed if self.parallel else Parsed(parsed.content, parsed.calls[:1])

    def shape(self, choice: ChatChoice) -> ChatChoice:
        """A finished choice, its text turned into calls where it holds them."""
        parsed = self.parsed(choice.message.content or "", cut=choice.finish_reason == "length")
        if not parsed.calls:
            return choice
        message = ChatMessageOut(content=parsed.content,
                                 tool_calls=[ToolCallOut(id=call_id(), function={"name": c.name,
                                                                                "arguments": c.arguments})
                                             for c in parsed.calls])
        return choice.model_copy(update={"message": message, "finish_reason": _reason(choice.finish_reason)})

    def deltas(self, index: int, text: str) -> list[dict[str, Any]]:
        """The deltas a choice's new text makes now (maybe none: held)."""
        state = self._choices.setdefault(index, _ChoiceText())
        state.text += text
        if self.mode == "named":
            out = [] if state.announced else [_call_delta(0, self.named or "", "", call_id())]
            state.announced = True
            return out + ([_call_delta(0, None, text)] if text else [])
        if self.mode == "required":
            return []
        cut = may_start_call(state.text, self.parser) if self.mode == "auto" else None
        end = len(state.text) if cut is None else cut
        if end <= state.emitted or not state.text[:end].strip():  # leading blanks wait: a call may follow them
            return []
        content, state.emitted = state.text[state.emitted:end], end
        return [{"content": content}]

    def closing(self, index: int, reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """The deltas a choice's end releases, and its finish_reason."""
        state = self._choices.pop(index, _ChoiceText())
        if self.mode == "named":
            return ([] if state.announced else [_call_delta(0, self.named or "", "", call_id())]), _reason(reason)
        parsed = self.parsed(state.text, cut=reason == "length") if self.mode != "none" else Parsed(state.text, [])
        if parsed.calls:
            return [_call_delta(i, c.name, c.arguments, call_id()) for i, c in enumerate(parsed.calls)], \
                _reason(reason)
        tail = state.text[state.emitted:]
        return ([{"content": tail}] if tail else []), reason


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _call_delta(index: int, name: str | None, arguments: str, id_: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id_ is not None:
        call.update(id=id_, type="function")
    if name is not None:
        call["function"]["name"] = name
    return {"tool_calls": [call]}


def _reason(reason: str | None) -> str | None:
    """An answer that ended on its own with calls finished to call them; one cut short says why."""
    return "tool_calls" if reason == "stop" else reason
