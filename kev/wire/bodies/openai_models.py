"""OpenAI-compatible bodies (/v1/chat/completions, /v1/completions, /v1/models).

Unknown parameters are ignored, as OpenAI-compatible servers do; parameters Kev cannot
honour (tools, repetition_penalty, suffix, …) are refused by name rather than
silently dropped (UNSUPPORTED).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kev.engine.sampling_params import SamplingParams
from kev.wire.bodies.api_models import (MAX_SEED, NonEmptyText, Stop, StructuredOutputs, Temperature, Text,
                                        whole_numbers)
from kev.wire.bodies.errors import ApiError
from kev.wire.bodies.tool_schema import ToolCallIn, ToolCallOut, ToolChoice, ToolDef

MAX_LOGPROBS = 20
TokenId = Annotated[int, Field(ge=0)]
# Accepted with their no-op value (what clients send by default); anything else is refused by name.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None, False, True), "repetition_penalty": (None, 1, 1.0), "suffix": (None, ""),
    "min_tokens": (None, 0), "min_p": (None, 0, 0.0), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "guided_whitespace_pattern": (None,), "guided_decoding_backend": (None,),
}

def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: true is not 1 (Python says it is), 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


class _OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        return whole_numbers(cls, data)  # 2.0 is the integer 2, as JSON Schema says


class SpeculativeConfig(_OpenAIBody):
    """vLLM's speculative_config (an engine argument there), per request here, in vLLM's names only (the Kev API's
    `speculative` takes Kev's): prompt-lookup drafts that never change the answer. Unset fields take the config's
    `speculative` section; method "off" turns its drafts off."""

    # forbid, not ignore: a Kev name here (max_draft) or a draft model vLLM would load is refused by name
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    method: Literal["off", "ngram", "prompt_lookup"] | None = None
    num_speculative_tokens: int | None = Field(None, ge=1, le=64, description="tokens a draft may propose")
    prompt_lookup_min: int | None = Field(None, ge=1, le=32, description="shortest n-gram looked up")
    prompt_lookup_max: int | None = Field(None, ge=1, le=32, description="longest n-gram looked up")

    def engine(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)  # kev.engine.drafts.parse_speculative reads vLLM's names


class TextPart(_OpenAIBody):
    type: Literal["text"]
    text: Text


class OpenAIMessage(_OpenAIBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(min_length=1)] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = Field(None, description="an assistant turn's calls (content may be null)")
    tool_call_id: Text | None = Field(None, description="on a tool message: the call it answers")

    @model_validator(mode="after")
    def _has_content(self) -> OpenAIMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content: is required (null only on an assistant message with tool_calls)")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def to_engine(self) -> dict[str, str]:
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text}


class StreamOptions(_OpenAIBody):
    include_usage: bool = False


class JsonSchemaFormat(_OpenAIBody):
    name: Text
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: Text | None = None


class ResponseFormat(_OpenAIBody):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(_OpenAIBody):
    # extra="allow": kept only to refuse the UNSUPPORTED ones by name
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: Text
    max_tokens: int | None = Field(None, ge=1)
    temperature: Temperature = Field(None, description="OpenAI's default is 1; 0 is greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=128, description="choices per prompt, each in its own channel")
    stop: Stop = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Kev extensions
    top_k: int | None = Field(None, ge=0)
    ignore_eos: bool | None = Field(None, description="vLLM's: keep generating past end-of-sequence tokens")
    include_stop_str_in_output: bool | None = Field(None, description="vLLM's: the stop string that ended the answer "
                                                                      "stays at the end of its text")
    isolation: Literal["strict", "shared", "loose"] | None = None
    timeout_ms: int | None = Field(None, ge=1)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, description="token id -> bias added to its logit, in this choice's channel only")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    best_of: int | None = Field(None, ge=1, le=128, description="candidates per prompt (each its own channel); "
                                "the n with the highest total logprob are answered")
    # Structured output, per choice (each choice is its own channel with its own grammar state)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM's: one of json, json_object, regex, choice, grammar")
    guided_json: dict[str, Any] | Text | None = None
    guided_regex: NonEmptyText | None = None
    guided_choice: Annotated[list[NonEmptyText], Field(min_length=1)] | None = None
    guided_grammar: NonEmptyText | None = None
    # vLLM's engine argument, per request here: {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min":
    # M, "prompt_lookup_max": N}; drafts never change the answer.
    speculative_config: SpeculativeConfig | None = None

    def check_supported(self) -> None:
        extra = self.model_extra or {}
        for name, allowed in UNSUPPORTED.items():
            if name in extra and not any(_same_json(extra[name], value) for value in allowed):
                raise ApiError(422, f"{name}: not supported by Kev (refused rather than ignored)", name)
        if self.best_of is not None and self.best_of < self.n:
            raise ApiError(400, f"best_of: must be at least n ({self.n}), got {self.best_of}", "best_of")
        if self.num_candidates > self.n and self.stream:
            raise ApiError(400, "best_of: not supported together with stream (as OpenAI)", "best_of")

    @property
    def num_candidates(self) -> int:
        """Channels per prompt: best_of candidates, of which the n most likely are answered."""
        return self.best_of or self.n

    def structure(self) -> tuple[str | None, dict[str, Any] | None]:
        """(the body field that set it, the engine's structured_outputs), at most one source."""
        sources = {name: value for name, value in (
            ("response_format", self._response_format()), ("structured_outputs", self._structured_outputs()),
            ("guided_json", None if self.guided_json is None else {"json": self.guided_json}),
            ("guided_regex", None if self.guided_regex is None else {"regex": self.guided_regex}),
            ("guided_choice", None if self.guided_choice is None else {"choice": self.guided_choice}),
            ("guided_grammar", None if self.guided_grammar is None else {"grammar": self.guided_grammar}),
        ) if value is not None}
        if len(sources) > 1:
            names = sorted(sources)
            raise ApiError(422, f"{names[0]}: only one structured-output field per request (got {', '.join(names)})",
                           names[0])
        return next(iter(sources.items()), (None, None))

    def _response_format(self) -> dict[str, Any] | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"json_object": True}
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ApiError(400, "response_format.json_schema.schema: is required for type json_schema",
                           "response_format.json_schema.schema")
        return {"json": fmt.json_schema.schema_}

    def _structured_outputs(self) -> dict[str, Any] | None:
        return None if self.structured_outputs is None else self.structured_outputs.engine()

    def engine_sampling(self, max_tokens: int | None, logprobs: dict[str, Any]) -> SamplingParams:
        """The body's SamplingParams (OpenAI's defaults where it sets nothing; the engine checks the values).
        best_of > n ranks candidates by total logprob, so then every candidate records its tokens' logprobs."""
        _, structured = self.structure()
        ranked = {"logprobs": 0} if self.num_candidates > self.n else {}
        return SamplingParams.from_options({**ranked,
            "max_tokens": max_tokens, "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop, "structured_outputs": structured,
            "logit_bias": self.logit_bias or None, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty, "ignore_eos": self.ignore_eos,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "speculative": None if self.speculative_config is None else self.speculative_config.engine(), **logprobs})

    def request_options(self) -> dict[str, Any]:
        """submit()'s request-level options the body sets."""
        return {key: value for key, value in (("isolation", self.isolation), ("timeout_ms", self.timeout_ms))
                if value is not None}

    def seeded(self, query: dict[str, Any], choice: int) -> dict[str, Any]:
        """The query for one of the request's candidates, with that candidate's seed if any."""
        seed = self.choice_seed(choice)
        return query if seed is None else {**query, "seed": seed}

    def choice_seed(self, choice: int) -> int | None:
        """n samples of one prompt differ, yet a seeded request stays reproducible."""
        return None if self.seed is None else (self.seed + choice) % (MAX_SEED + 1)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionBody(_Sampling):
    messages: list[OpenAIMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = Field(None, description="default: auto with tools, none without")
    parallel_tool_calls: bool | None = Field(None, description="default true: several calls in one answer")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = Field(None, description="each token's logprob (the model's, before temperature/top-p)")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @property
    def uses_tools(self) -> bool:
        """Tools offered, or a history holding tool calls or tool results: rendered by kev/wire/tools."""
        return bool(self.tools) or self.tool_choice not in (None, "none") or any(
            m.tool_calls or m.role == "tool" for m in self.messages)

    def check_no_tools(self, where: str) -> None:
        """For surfaces that do not take tools yet (batch lines): refused by name, never ignored."""
        if self.uses_tools:
            field = "tools" if self.tools else "tool_choice" if self.tool_choice not in (None, "none") else "messages"
            raise ApiError(422, f"{field}: tool calling is not supported in {where} (/v1/chat/completions takes it)",
                           field)

    def logprob_options(self) -> dict[str, Any]:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(422, "top_logprobs: needs logprobs: true", "top_logprobs")
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}


COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class CompletionBody(_Sampling):
    # A string, a list of strings, a list of token ids, or a list of lists of token ids (OpenAI's schema).
    prompt: Text | Annotated[list[TokenId], Field(min_length=1)] | Annotated[list[Text], Field(min_length=1)] \
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    max_tokens: int | None = Field(
        None, ge=0, description="default 16 (OpenAI's), within the server's cap; 0 with echo scores only")
    echo: bool = Field(False, description="the prompt comes first in text (and in logprobs, its first token null)")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="alternatives per token")

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: its text or its token ids."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]
        return list(self.prompt)  # type: ignore[arg-type]  # the branch above took str and list[int]

    @property
    def is_single(self) -> bool:
        return isinstance(self.prompt, str) or isinstance(self.prompt[0], int)

    def resolved_max_tokens(self, cap: int) -> int:
        return self.max_tokens if self.max_tokens is not None else min(COMPLETION_MAX_TOKENS, cap)

    def engine_queries(self) -> list[dict[str, Any]]:
        """One engine question per prompt and candidate (a prompt's candidates are adjacent)."""
        return [self.seeded({"prompt" if isinstance(p, str) else "prompt_ids": p}, j)
                for p in self.prompts for j in range(self.num_candidates)]

    def logprob_options(self, max_tokens: int) -> dict[str, Any]:
        if max_tokens == 0 and not self.echo:
            raise ApiError(422, "max_tokens: 0 is only allowed with echo: true (scoring the prompt)", "max_tokens")
        if self.echo and self.stream:
            raise ApiError(422, "echo: not supported together with stream", "echo")
        options: dict[str, Any] = {} if self.logprobs is None else {"logprobs": self.logprobs}
        if self.echo and (self.logprobs is not None or max_tokens == 0):
            options["prompt_logprobs"] = True
        return options


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# "timeout" and "cancelled" are Kev's own (not OpenAI's): an answer cut short is never reported as "length".
FinishReason = Literal["stop", "length", "timeout", "cancelled", "tool_calls"]


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = Field(None, description="always null: Kev never refuses in place of an answer (OpenAI's "
                                                  "required, nullable field)")
    # absent, not null, without calls (OpenAI's schema: an array when present)
    tool_calls: list[ToolCallOut] | None = Field(None, exclude_if=lambda calls: calls is None)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: FinishReason | None
    logprobs: dict[str, Any] | None = Field(None, description="{content: [{token, logprob, bytes, top_logprobs}]}")


class _Reply(BaseModel):
    """What a chat completion and a text completion share."""

    id: str
    created: int
    model: str
    system_fingerprint: str | None = None
    usage: Usage


class ChatCompletion(_Reply):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    tool_prompt: str | None = Field(None, description="with tools: how they reached the model (chat_template, or "
                                    "kev_generic: Kev's system message, for templates without a tools slot)")


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: dict[str, Any] | None = Field(None, description="{tokens, token_logprobs, top_logprobs, text_offset}")


class Completion(_Reply):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kev"
    max_model_len: int | None = Field(None, description="core.max_context (as vLLM's card)")
    tool_prompt: str | None = Field(None, description="how tools reach the model: chat_template, or kev_generic "
                                    "(Kev's system message, for templates without a tools slot)")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
