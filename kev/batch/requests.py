"""A BatchLine's body, checked as the HTTP route checks it, becomes the engine questions and options it stands for.

The bodies are the OpenAI routes' own models (kev/wire/bodies/openai_models.py) and the server's
limits, so a line is refused for exactly what the route would refuse, naming the same field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from kev.engine.sampling_params import SamplingParams
from kev.batch.input_file import CHAT_URL, BatchLine, LineError
from kev.config import KevConfig
from kev.wire.answer_errors import BodyShape
from kev.wire.bodies.errors import ApiError, validation_error
from kev.wire.limits import Limits
from kev.wire.openai_format import Kind
from kev.wire.bodies.openai_models import ChatCompletionBody, CompletionBody



@dataclass(frozen=True)
class BatchRequest:
    """One line, ready for EngineBridge.submit: each candidate of each prompt is a question, one channel each."""

    line: BatchLine
    queries: list[Any]
    sampling: SamplingParams
    options: dict[str, Any]  # submit()'s request-level options (isolation, timeout_ms)
    kind: Kind
    n: int  # candidates per prompt (best_of, else n); question index = prompt_index * n + candidate
    keep: int  # choices answered per prompt (n): the most likely `keep` of the n candidates
    logprobs: bool = False
    # completions with echo: each prompt (token ids decoded at answer time)
    echo: tuple[str | list[int], ...] | None = None
    single_prompt: bool = False  # completions: prompt was one string or one list of ids (errors name "prompt")
    structure_field: str | None = None  # the body field that asked for structured output

    @property
    def custom_id(self) -> str:
        return self.line.custom_id

    @property
    def shape(self) -> BodyShape:
        """How its questions map back to the body's fields (for errors named as the route names them)."""
        return BodyShape(self.kind, self.n, self.single_prompt, self.structure_field)


def served_model_name(config: KevConfig) -> str:
    """The model id the server answers to (as KevService names it)."""
    return config.server.model_name or Path(config.core.model_path).name.removesuffix(".gguf")


@dataclass(frozen=True)
class RequestBuilder:
    model_name: str
    limits: Limits
    defaults: dict[str, Any]  # body fields a line does not set (kev batch --max-tokens, --temperature)

    @classmethod
    def from_config(cls, config: KevConfig, defaults: dict[str, Any] | None = None) -> RequestBuilder:
        return cls(served_model_name(config), Limits.from_config(config), defaults or {})

    def build(self, line: BatchLine) -> BatchRequest:
        """Raises LineError naming the line and the body field at fault."""
        body = {"model": self.model_name, **self.defaults, **line.body}
        try:
            return self._chat(line, body) if line.url == CHAT_URL else self._completion(line, body)
        except ValidationError as invalid:  # the route's own wording and status (422) for the same problem
            problems = [{**p, "loc": ("body", *p.get("loc", ()))} for p in invalid.errors()]
            err = validation_error(RequestValidationError(problems))
            field = f"body.{err.field}" if err.field != "body" else "body"
            message = err.message.removeprefix(f"{err.field}: ")
            raise LineError(line.line_no, line.custom_id, field, message, err.status_code) from None
        except ApiError as err:
            field = f"body.{err.field}" if err.field else "body"
            message = err.message.removeprefix(f"{err.field}: ") if err.field else err.message
            raise LineError(line.line_no, line.custom_id, field, message, err.status_code) from None

    def _chat(self, line: BatchLine, body: dict[str, Any]) -> BatchRequest:
        chat = ChatCompletionBody.model_validate(body)
        self._check(chat.model, chat.stream, chat.num_candidates, chat.max_completion_tokens or chat.max_tokens,
                    chat.timeout_ms)
        self.limits.check_max_tokens(chat.max_tokens, "max_tokens")  # as the route: even beside max_completion_tokens
        chat.check_supported()
        chat.check_no_tools("a batch line")
        messages = [m.to_engine() for m in chat.messages]
        self.limits.check_chars(sum(len(m["content"]) for m in messages), "messages")
        queries = [chat.seeded({"messages": messages}, j) for j in range(chat.num_candidates)]
        sampling = chat.engine_sampling(chat.max_completion_tokens or chat.max_tokens, chat.logprob_options())
        return BatchRequest(line, queries, sampling.with_max_tokens(self.limits.default_max_tokens),
                            chat.request_options(), "chat", chat.num_candidates,
                            chat.n, bool(chat.logprobs), structure_field=chat.structure()[0])

    def _completion(self, line: BatchLine, body: dict[str, Any]) -> BatchRequest:
        body_ = CompletionBody.model_validate(body)
        prompts = body_.prompts
        max_tokens = body_.resolved_max_tokens(self.limits.max_tokens_cap)
        self._check(body_.model, body_.stream, len(prompts) * body_.num_candidates, max_tokens, body_.timeout_ms)
        body_.check_supported()
        for i, prompt in enumerate(prompts):
            self.limits.check_chars(len(prompt), "prompt" if body_.is_single else f"prompt[{i}]")
        queries = body_.engine_queries()
        sampling = body_.engine_sampling(max_tokens, body_.logprob_options(max_tokens))
        return BatchRequest(line, queries, sampling, body_.request_options(), "text",
                            body_.num_candidates, body_.n, body_.logprobs is not None,
                            tuple(prompts) if body_.echo else None, body_.is_single, body_.structure()[0])

    def _check(self, model: str, stream: bool, num_questions: int, max_tokens: int | None,
               timeout_ms: int | None) -> None:
        if model != self.model_name:
            raise ApiError(404, f"model: {model!r} is not served here (this server serves {self.model_name!r})",
                           "model")
        if stream:
            raise ApiError(400, "stream: a batch line cannot stream (its answer is one output line)", "stream")
        self.limits.check_count(num_questions, "n")
        self.limits.check_max_tokens(max_tokens, "max_tokens")
        self.limits.check_timeout(timeout_ms, "timeout_ms")


def build_all(lines: list[BatchLine], builder: RequestBuilder) -> tuple[list[BatchRequest], list[LineError]]:
    requests: list[BatchRequest] = []
    errors: list[LineError] = []
    for line in lines:
        try:
            requests.append(builder.build(line))
        except LineError as err:
            errors.append(err)
    return requests, errors
