"""Kev results and stream events in OpenAI's shapes (responses, stream chunks, usage)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from kev.results.result import Result
from kev.engine.request import StreamEvent
from kev.wire.bodies.openai_models import (ChatChoice, ChatCompletion, ChatMessageOut, Completion, CompletionChoice,
                                           Usage)
from kev.wire.tools.reply import ToolReply

Kind = Literal["chat", "text"]


@dataclass(frozen=True)
class Reply:
    """Who is answering what: enough to stamp every response and chunk the same way."""

    kind: Kind
    id: str
    created: int
    model: str
    n: int  # choices per prompt; question index = prompt_index * n + choice
    logprobs: bool = False  # answer with logprobs objects
    echo: tuple[str, ...] | None = None  # completions with echo: each prompt's text, put before its answer
    tools: ToolReply | None = None  # chat with tools: answers become tool calls where they hold them

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def named(self, request_id: str) -> Reply:
        """Stamped with the request's id as OpenAI spells it (chatcmpl-..., cmpl-...); "" leaves it unnamed."""
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        return dataclasses.replace(self, id=prefix + request_id if request_id else "")

    def answer(self, results: list[Result], keep: int) -> ChatCompletion | Completion:
        """The response body, `keep` choices per prompt: the most likely of the n candidates (OpenAI's best_of)."""
        usage = self.usage(results)  # every candidate's tokens count, as OpenAI bills best_of
        if keep < self.n:
            return dataclasses.replace(self, n=keep).response(best_of(results, self.n, keep), usage)
        return self.response(results, usage)

    def response(self, results: list[Result], usage: Usage | None = None) -> ChatCompletion | Completion:
        fingerprint = results[0].numerics_fingerprint if results else None
        usage = usage or self.usage(results)
        if self.kind == "chat":
            chat = [ChatChoice(index=r.index, message=ChatMessageOut(content=r.text), finish_reason=finish_reason(r),
                               logprobs=self._chat_logprobs(r.logprobs or []))
                    for r in results]
            if self.tools is not None:
                chat = [self.tools.shape(choice) for choice in chat]
            return ChatCompletion(id=self.id, created=self.created, model=self.model, system_fingerprint=fingerprint,
                                  choices=chat, usage=usage,
                                  tool_prompt=None if self.tools is None else self.tools.prompt_kind)
        text = [CompletionChoice(index=r.index, text=self._prompt_text(r) + r.text, finish_reason=finish_reason(r),
                                 logprobs=self._text_logprobs(self._scored(r))) for r in results]
        return Completion(id=self.id, created=self.created, model=self.model, system_fingerprint=fingerprint,
                          choices=text, usage=usage)

    def _prompt_text(self, result: Result) -> str:
        return self.echo[result.index // self.n] if self.echo is not None else ""

    def _scored(self, result: Result) -> list[dict[str, Any]]:
        """The tokens whose logprobs the choice shows: the prompt's first when echoing, then the answer's."""
        return ((result.prompt_logprobs or []) if self.echo is not None else []) + (result.logprobs or [])

    def _chat_logprobs(self, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        public = lambda e: {"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"]}  # noqa: E731
        return {"content": [{**public(e), "top_logprobs": [public(t) for t in e["top_logprobs"]]} for e in entries],
                "refusal": None}

    def _text_logprobs(self, entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any] | None:
        """OpenAI's legacy shape; top_logprobs maps token text to logprob, the chosen token included (as vLLM)."""
        if not self.logprobs:
            return None
        tokens, offsets = [e["token"] for e in entries], []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        tops: list[dict[str, float] | None] = []
        for e in entries:
            if e["logprob"] is None:
                tops.append(None)
                continue
            top = {t["token"]: t["logprob"] for t in e["top_logprobs"]}
            top.setdefault(e["token"], e["logprob"])
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries], "top_logprobs": tops,
                "text_offset": offsets}

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

    def event_chunks(self, event: StreamEvent) -> list[dict[str, Any]]:
        """The chunks one stream event makes (none, one, or with tools several: held text, calls, the finish)."""
        if self.tools is None or self.kind != "chat":
            chunk = self.event_chunk(event)
            return [] if chunk is None else [chunk]
        choice = lambda delta, reason=None: self.chunk(  # noqa: E731
            [{"index": event.index, "delta": delta, "finish_reason": reason}])
        chunks = [choice(d) for d in self.tools.deltas(event.index, event.text)] if event.text else []
        if event.result is not None:
            closing, reason = self.tools.closing(event.index, finish_reason(event.result))
            chunks += [choice(d) for d in closing] + [choice({}, reason)]
        return chunks

    def event_chunk(self, event: StreamEvent) -> dict[str, Any] | None:
        if event.result is not None:
            reason = finish_reason(event.result)
            choice = {"index": event.index, "delta": {}, "finish_reason": reason} if self.kind == "chat" else \
                {"index": event.index, "text": "", "finish_reason": reason, "logprobs": None}
            return self.chunk([choice])
        if not event.text and not (self.logprobs and event.logprobs):
            return None
        if self.kind == "chat":
            choice = {"index": event.index, "delta": {"content": event.text}, "finish_reason": None,
                      "logprobs": self._chat_logprobs(event.logprobs)}
        else:
            choice = {"index": event.index, "text": event.text, "finish_reason": None,
                      "logprobs": self._text_logprobs(event.logprobs)}
        return self.chunk([choice])


def best_of(results: list[Result], candidates: int, keep: int) -> list[Result]:
    """OpenAI's best_of: per prompt, the `keep` candidates with the highest total logprob, re-indexed 0..keep-1."""
    chosen: list[Result] = []
    for prompt in sorted({r.index // candidates for r in results}):
        group = sorted((r for r in results if r.index // candidates == prompt),
                       key=lambda r: (-sum(e["logprob"] for e in r.logprobs or []), r.index))
        chosen += [dataclasses.replace(r, index=prompt * keep + rank) for rank, r in enumerate(group[:keep])]
    return chosen


def finish_reason(result: Result) -> Literal["stop", "length", "timeout", "cancelled"]:
    """OpenAI knows stop and length; an answer a deadline or a cancel cut short says so (non-standard values)."""
    reason = result.finish_reason
    return reason if reason in ("stop", "length", "timeout", "cancelled") else "stop"
