"""Kev results and stream events in OpenAI's shapes (responses, stream chunks, usage)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kev.aggregator.result import Result
from kev.engine.request import StreamEvent
from kev.server.openai_models import ChatChoice, ChatCompletion, ChatMessageOut, Completion, CompletionChoice, Usage

Kind = Literal["chat", "text"]


@dataclass(frozen=True)
class Reply:
    """Who is answering what: enough to stamp every response and chunk the same way."""

    kind: Kind
    id: str
    created: int
    model: str
    n: int  # choices per prompt; question index = prompt_index * n + choice

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def response(self, results: list[Result]) -> ChatCompletion | Completion:
        fingerprint = results[0].numerics_fingerprint if results else None
        if self.kind == "chat":
            chat = [ChatChoice(index=r.index, message=ChatMessageOut(content=r.text), finish_reason=finish_reason(r))
                    for r in results]
            return ChatCompletion(id=self.id, created=self.created, model=self.model, system_fingerprint=fingerprint,
                                  choices=chat, usage=self.usage(results))
        text = [CompletionChoice(index=r.index, text=r.text, finish_reason=finish_reason(r)) for r in results]
        return Completion(id=self.id, created=self.created, model=self.model, system_fingerprint=fingerprint,
                          choices=text, usage=self.usage(results))

    def usage(self, results: list[Result]) -> Usage:
        # n choices of one prompt read that prompt once, as OpenAI counts it.
        prompt = sum(r.prompt_tokens for r in results if r.index % self.n == 0)
        completion = sum(r.completion_tokens for r in results)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": self.object + ".chunk" if self.kind == "chat" else self.object,
                                "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage.model_dump()
        return body

    def opening(self, num_choices: int) -> list[dict[str, Any]]:
        """Chat streams announce the assistant role once per choice before any text."""
        if self.kind != "chat":
            return []
        return [self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
                for i in range(num_choices)]

    def event_chunk(self, event: StreamEvent) -> dict[str, Any] | None:
        if event.result is not None:
            reason = finish_reason(event.result)
            choice = {"index": event.index, "delta": {}, "finish_reason": reason} if self.kind == "chat" else \
                {"index": event.index, "text": "", "finish_reason": reason, "logprobs": None}
            return self.chunk([choice])
        if not event.text:
            return None
        choice = {"index": event.index, "delta": {"content": event.text}, "finish_reason": None} if self.kind == "chat" \
            else {"index": event.index, "text": event.text, "finish_reason": None, "logprobs": None}
        return self.chunk([choice])


def finish_reason(result: Result) -> Literal["stop", "length", "timeout", "cancelled"]:
    """OpenAI knows stop and length; an answer a deadline or a cancel cut short says so (non-standard values)."""
    reason = result.finish_reason
    return reason if reason in ("stop", "length", "timeout", "cancelled") else "stop"  # type: ignore[return-value]
