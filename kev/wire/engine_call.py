"""An OpenAI chat or completion body, checked, becomes the engine call it stands for: the questions, their
SamplingParams, the request options and the shape of the reply.

/v1/chat/completions, /v1/completions, /v1/responses and every batch line come through here, so a body is refused
for the same thing in the same words, and asks the engine the same questions, wherever it is sent.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kev.config import KevConfig
from kev.engine.sampling_params import SamplingParams
from kev.model.tokenizer import Tokenizer
from kev.wire.answer_errors import BodyShape
from kev.wire.bodies.errors import ApiError
from kev.wire.bodies.openai_models import ChatCompletionBody, CompletionBody
from kev.wire.limits import Limits
from kev.wire.openai_format import Reply
from kev.wire.tools.prompt import Parser
from kev.wire.tools.reply import ToolReply
from kev.wire.tools.request import tool_request


@dataclass(frozen=True)
class ToolSetup:
    """How a chat body's tools become its prompt (kev/wire/tools/request.py)."""

    tokenizer: Callable[[], Tokenizer]  # asked only for a body that uses tools (the server's is a 503 while loading)
    parser: Parser  # server.tool_call_parser
    system: str | None  # isolation.system_prompt, put first when the caller sent none


@dataclass(frozen=True)
class Served:
    """Who answers the body: the model it must name, the limits it must keep, how it renders tools."""

    model_name: str
    limits: Limits
    tools: ToolSetup | None = None  # None: no tools taken here (a batch line), refused by name
    batch_line: bool = False  # the answer is one output line: no stream

    def check(self, model: str, stream: bool, num_questions: int, max_tokens: int | None,
              timeout_ms: int | None) -> None:
        if model != self.model_name:
            raise unknown_model(model, self.model_name)
        if stream and self.batch_line:
            raise ApiError(400, "stream: a batch line cannot stream (its answer is one output line)", "stream")
        self.limits.check_count(num_questions, "n")
        self.limits.check_max_tokens(max_tokens, "max_tokens")
        self.limits.check_timeout(timeout_ms, "timeout_ms")


@dataclass(frozen=True)
class EngineCall:
    """One body, ready for EngineBridge.submit: each candidate of each prompt is a question, one channel each."""

    queries: list[Any]
    sampling: SamplingParams
    options: dict[str, Any]  # submit()'s request-level options (isolation, timeout_ms)
    shape: BodyShape  # kind, candidates per prompt (question index = prompt_index * n + candidate), error fields
    keep: int  # choices answered per prompt (n): the most likely `keep` of the shape.n candidates
    logprobs: bool = False
    echo: tuple[str | list[int], ...] | None = None  # completions with echo: each prompt, put before its answer
    tools: ToolReply | None = None  # chat with tools: answers become tool calls where they hold them

    def reply(self, model: str, decode: Callable[[list[int]], str], request_id: str = "") -> Reply:
        """How every response and chunk of this call is stamped; decode: an echoed prompt's token ids to text."""
        echo = None if self.echo is None else tuple(p if isinstance(p, str) else decode(p) for p in self.echo)
        reply = Reply(self.shape.kind, "", int(time.time()), model, self.shape.n, self.logprobs, echo, self.tools)
        return reply.named(request_id)


def chat_call(body: ChatCompletionBody, served: Served, chars_field: str = "messages") -> EngineCall:
    """chars_field: the body field the message characters are counted in (`input` for a Responses body)."""
    max_tokens = body.max_completion_tokens or body.max_tokens
    served.check(body.model, body.stream, body.num_candidates, max_tokens, body.timeout_ms)
    served.limits.check_max_tokens(body.max_tokens, "max_tokens")  # over the cap even beside max_completion_tokens
    body.check_supported()
    if served.tools is None:
        body.check_no_tools("a batch line")
    served.limits.check_chars(sum(len(m.text) for m in body.messages), chars_field)
    sampling = body.engine_sampling(max_tokens, body.logprob_options())
    query: dict[str, Any] = {"messages": [m.to_engine() for m in body.messages]}
    tools = None
    if body.uses_tools and served.tools is not None:  # rendered here, with the tools; the engine takes the prompt
        setup = served.tools
        request = tool_request(body, setup.tokenizer(), setup.parser, setup.system)
        query, tools = {"prompt": request.prompt}, request.reply
        if request.structure is not None:
            sampling = dataclasses.replace(sampling, structured_outputs=request.structure)
    forced = "tools" if tools is not None and tools.mode in ("named", "required") else None  # the tools' grammar
    return EngineCall([body.seeded(query, j) for j in range(body.num_candidates)],
                      served.limits.with_default_max_tokens(sampling), body.request_options(),
                      BodyShape("chat", body.num_candidates, False, body.structure()[0] or forced), body.n,
                      bool(body.logprobs), tools=tools)


def completion_call(body: CompletionBody, served: Served) -> EngineCall:
    prompts = body.prompts
    max_tokens = body.resolved_max_tokens(served.limits.max_tokens_cap)
    served.check(body.model, body.stream, len(prompts) * body.num_candidates, max_tokens, body.timeout_ms)
    body.check_supported()
    for i, prompt in enumerate(prompts):
        served.limits.check_chars(len(prompt), "prompt" if body.is_single else f"prompt[{i}]")
    queries = body.engine_queries()
    sampling = body.engine_sampling(max_tokens, body.logprob_options(max_tokens))
    return EngineCall(queries, served.limits.with_default_max_tokens(sampling), body.request_options(),
                      BodyShape("text", body.num_candidates, body.is_single, body.structure()[0]), body.n,
                      body.logprobs is not None, tuple(prompts) if body.echo else None)


def unknown_model(model: str, served: str, error_type: str | None = None) -> ApiError:
    return ApiError(404, f"model: {model!r} is not served here (this server serves {served!r})", "model",
                    error_type=error_type)


def served_model_name(config: KevConfig) -> str:
    """The id /v1/models shows and callers send: server.model_name, else the name of core.model_path."""
    return config.server.model_name or Path(config.core.model_path).name.removesuffix(".gguf")
