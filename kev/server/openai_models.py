"""OpenAI-compatible bodies (/v1/chat/completions, /v1/completions, /v1/models).

Unknown parameters are ignored, as OpenAI-compatible servers do; parameters Kev cannot
honour (logprobs, echo, suffix) are refused by name rather than silently dropped.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kev.server.api_models import MAX_SEED, Stop, Temperature, Text


class _OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_OpenAIBody):
    type: Literal["text"]
    text: Text


class OpenAIMessage(_OpenAIBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(min_length=1)]
    name: Text | None = None

    def to_engine(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class StreamOptions(_OpenAIBody):
    include_usage: bool = False


class _Sampling(_OpenAIBody):
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
    isolation: Literal["strict", "shared", "loose"] | None = None
    timeout_ms: int | None = Field(None, ge=1)

    def engine_options(self, max_tokens: int | None) -> dict[str, Any]:
        options = {"max_tokens": max_tokens, "temperature": 1.0 if self.temperature is None else self.temperature,
                   "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop, "isolation": self.isolation,
                   "timeout_ms": self.timeout_ms}
        return {key: value for key, value in options.items() if value is not None}

    def choice_seed(self, choice: int) -> int | None:
        """n samples of one prompt differ, yet a seeded request stays reproducible."""
        return None if self.seed is None else (self.seed + choice) % (MAX_SEED + 1)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionBody(_Sampling):
    messages: list[OpenAIMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Literal[False] | None = Field(None, description="not supported")


class CompletionBody(_Sampling):
    prompt: Text | Annotated[list[Text], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1, description="default 16 (OpenAI's), within the server's cap")
    echo: Literal[False] | None = Field(None, description="not supported")
    logprobs: None = Field(None, description="not supported")
    suffix: None = Field(None, description="not supported")

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# "timeout" and "cancelled" are Kev's own (not OpenAI's): an answer cut short is never reported as "length".
FinishReason = Literal["stop", "length", "timeout", "cancelled"]


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: FinishReason | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kev"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
