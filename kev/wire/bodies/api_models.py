"""Request and response bodies of the Kev API (/v1/query, /v1/requests, /v1/channels); they make the OpenAPI schema.

Type errors are caught here (a 4xx naming the field); what depends on config (limits,
the isolation cap) is checked in limits.py and by the engine.
"""
from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from kev.engine.sampling_params import SamplingParams, split_submit

CONTENT_KEYS = ("text", "messages", "prompt", "prompt_ids")
MAX_SEED = 2**63 - 1  # torch generators take a signed 64-bit seed
MIN_TEMPERATURE = 1e-3  # below this, logits / temperature can overflow fp32 and poison the step


def _encodable(value: str) -> str:
    # JSON may carry lone surrogates ("\ud800") that no tokenizer accepts.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (not valid Unicode text)") from None
    return value


def _temperature(value: float | None) -> float | None:
    if value is not None and 0 < value < MIN_TEMPERATURE:
        raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}")
    return value


Text = Annotated[str, AfterValidator(_encodable)]
NonEmptyText = Annotated[str, Field(min_length=1), AfterValidator(_encodable)]  # "at least 1 character"
Temperature = Annotated[float | None, Field(ge=0, le=100), AfterValidator(_temperature)]
StopText = NonEmptyText
Stop = StopText | Annotated[list[StopText], Field(max_length=16)] | None


def whole_numbers(model: type[BaseModel], data: Any) -> Any:
    """JSON has one kind of number, and JSON Schema's `integer` is any number whose fraction is zero: 2.0 is the
    integer 2 (OpenAI's and vLLM's servers take it too). Strict validation would refuse it, so the integer fields
    (and lists of them) get such numbers as ints first; 2.5, "2" and true stay refused. Only fields typed int:
    a float field takes an int as it is, and free JSON (a schema, tool arguments) is left exactly as written."""
    if not isinstance(data, dict):
        return data
    keys = _integer_keys(model)
    return {key: _as_int(value) if key in keys else value for key, value in data.items()}


@cache
def _integer_keys(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(field.alias or name for name, field in model.model_fields.items() if _holds_int(field.annotation))


def _holds_int(annotation: Any) -> bool:
    return annotation is int or any(_holds_int(arg) for arg in get_args(annotation))


def _as_int(value: Any) -> Any:
    if type(value) is float and value.is_integer():
        return int(value)
    return [_as_int(item) for item in value] if isinstance(value, list) else value


class _Body(BaseModel):
    # strict: "8" is not a number and 1 is not a boolean; a wrong type is the caller's error, not ours to guess.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # NaN: "a finite number"

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        return whole_numbers(cls, data)


class StructuredOutputs(_Body):
    """Constrain the answer (vLLM's structured_outputs): exactly one of these."""

    json_: dict[str, Any] | Text | None = Field(None, alias="json", description="a JSON schema")
    json_object: Literal[True] | None = Field(None, description="any JSON object")
    regex: NonEmptyText | None = None
    choice: Annotated[list[NonEmptyText], Field(min_length=1)] | None = None
    grammar: NonEmptyText | None = Field(None, description="Lark (or GBNF) grammar")

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        if len(self.model_fields_set) != 1:
            raise ValueError("needs exactly one of json, json_object, regex, choice, grammar")
        return self

    def engine(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class Speculative(_Body):
    """Prompt-lookup drafts for these questions (kev.engine.drafts), in Kev's names (the OpenAI routes take vLLM's
    names, in speculative_config). Unset fields take the config's `speculative` section; method "off" turns its
    drafts off. Answers never change."""

    method: Literal["off", "prompt_lookup", "ngram"] | None = None
    max_draft: int | None = Field(None, ge=1, le=64, description="tokens a draft may propose")
    min_match: int | None = Field(None, ge=1, le=32, description="shortest n-gram looked up")
    max_match: int | None = Field(None, ge=1, le=32, description="longest n-gram looked up")

    def engine(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class _Sampling(_Body):
    """The sampling options a request sets for all its questions and a question may override."""

    max_tokens: int | None = Field(None, ge=0, description="0 only with prompt_logprobs (scoring only)")
    logprobs: int | None = Field(None, ge=0, le=20, description="each new token's logprob and this many alternatives "
                                 "(the model's distribution before temperature, top-k/top-p and grammar)")
    prompt_logprobs: bool | None = Field(None, description="also every prompt token's logprob (the first is null)")
    structured_outputs: StructuredOutputs | None = None
    speculative: Speculative | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(None, description="token id -> bias")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    temperature: Temperature = None
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Stop = None
    timeout_ms: int | None = Field(None, ge=1)


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: Text
    name: Text | None = None


class QuestionObject(_Sampling):
    """One question with its own overrides; exactly one of text, messages, prompt."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, json_schema_extra={
        "oneOf": [{"required": ["text"]}, {"required": ["messages"]}, {"required": ["prompt"]},
                  {"required": ["prompt_ids"]}]})

    # Not nullable: a key that is present must hold content (the schema's oneOf counts keys).
    text: Text = Field(None, description="a user message, rendered with the chat template")  # type: ignore[assignment]  # absent, never null
    messages: list[ChatMessage] = Field(None, min_length=1)  # type: ignore[arg-type]  # absent, never null
    prompt: Text = Field(None, description="raw prompt, no chat template")  # type: ignore[assignment]  # absent, never null
    prompt_ids: list[Annotated[int, Field(ge=0)]] = Field(None, min_length=1, description="the prompt as token ids")  # type: ignore[arg-type]  # absent, never null
    priority: int | None = Field(None, ge=-(2**31), le=2**31 - 1)

    @model_validator(mode="after")
    def _one_content(self) -> QuestionObject:
        present = [key for key in CONTENT_KEYS if key in self.model_fields_set]
        if len(present) != 1:
            raise ValueError("needs exactly one of 'text', 'messages', 'prompt' or 'prompt_ids' "
                             f"(got {present or 'none'})")
        return self


def _question_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "as_string"
    if isinstance(value, list):
        return "as_messages"
    if isinstance(value, (dict, QuestionObject)):
        return "as_object"
    return None


# A string, a chat message list, or an object; the tag picks the branch so an error names the real field.
Question = Annotated[
    Annotated[Text, Tag("as_string")] | Annotated[list[ChatMessage], Field(min_length=1), Tag("as_messages")]
    | Annotated[QuestionObject, Tag("as_object")],
    Discriminator(_question_kind, custom_error_type="question_type",
                  custom_error_message="must be a string, a list of chat messages or an object with text, messages "
                                       "or prompt"),
]


class SubmitBody(_Sampling):
    """Questions and request-level options (each question may override its sampling)."""

    queries: list[Question] = Field(min_length=1)
    isolation: Literal["strict", "shared", "loose"] | None = Field(
        None, description="at most as loose as the configured isolation.level")
    max_parallel: int | None = Field(None, ge=1)
    system: Text | None = Field(None, description="shared system prompt for every chat question")

    def engine_queries(self) -> list[Any]:
        return [q.model_dump(exclude_none=True, by_alias=True) if isinstance(q, QuestionObject)
                else [m.model_dump(exclude_none=True) for m in q] if isinstance(q, list) else q for q in self.queries]

    def engine_submit(self) -> tuple[SamplingParams, dict[str, Any]]:
        """submit()'s sampling and request-level options, as the body sets them."""
        return split_submit(None, self.model_dump(exclude={"queries", "stream"}, exclude_none=True, by_alias=True))


class QueryBody(SubmitBody):
    stream: bool = Field(False, description="Server-Sent Events: delta, result (one per question), done")


class ResultModel(BaseModel):
    """One question's answer with every audit field; fields the engine adds later pass through."""

    model_config = ConfigDict(extra="allow")

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    channel_id: int | None
    elapsed_ms: float
    started_at: float | None
    finished_at: float | None
    finish_reason: Literal["stop", "length", "timeout", "cancelled", "error"] | None
    status: Literal["ok", "timeout", "cancelled", "rejected", "error"]
    error: str | None
    error_field: str | None = Field(None, description="the question's field at fault when the error is the caller's "
                                    "input (e.g. queries[0].structured_outputs); null for the engine's own failure")
    isolation: str
    strategy: str
    hash_bucket: int | None = None
    rerouted: bool = False
    original_text: str | None = None
    normalized_text: str | None = None
    numerics_fingerprint: str
    isolation_verified: bool | None = None
    logprobs: list[dict[str, Any]] | None = Field(None, description="per new token {token_id, token, bytes, logprob, "
                                                  "top_logprobs}, when asked")
    prompt_logprobs: list[dict[str, Any]] | None = Field(None, description="per prompt token, the first's logprob null")


class QueryResponse(BaseModel):
    request_id: str
    results: list[ResultModel]


RequestStatusName = Literal["running", "done", "cancelled"]


class RequestStatus(BaseModel):
    request_id: str
    status: RequestStatusName
    num_questions: int
    num_finished: int
    results: list[ResultModel] = Field(description="results so far, in aggregator order")


class Accepted(BaseModel):
    request_id: str
    status: RequestStatusName
    num_questions: int
    location: str = Field(description="GET it for status and results")


class ChannelModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    channel_id: int
    state: str = Field(description="idle, prefill or decode")
    request_id: str | None
    index: int | None
    tokens: int
    kv_blocks: int
    num_served: int
    hash_bucket: int | None = None


class ChannelsResponse(BaseModel):
    channels: list[ChannelModel] = Field(description="every channel for the operator; for a tenant, only the "
                                                     "channels running its own questions")
    queue_length: int
    num_active: int = Field(description="busy channels, every tenant's")
    num_channels: int | None = None
    num_busy_other_tenants: int | None = Field(None, description="for a tenant: busy channels running other "
                                                                 "tenants' questions (counted, never named)")


class StepModel(BaseModel):
    at: float = Field(description="unix seconds when the step ended")
    num_channels: int = Field(description="channels in the one forward (batch size)")
    num_tokens: int = Field(description="tokens computed (prefill + decode)")
    num_sampled: int = Field(description="tokens generated")
    step_ms: float


class StatsResponse(BaseModel):
    now: float = Field(description="the server's clock (unix seconds), to align the steps' `at`")
    num_steps: int
    num_tokens_computed: int
    num_tokens_generated: int
    steps: list[StepModel] = Field(description="the engine's most recent steps after `since`, oldest first")


class ErrorDetail(BaseModel):
    message: str
    type: str
    field: str | None
    param: str | None
    code: str | None = Field(None, description="OpenAI's error code key: always null here (`type` and `field` say "
                                               "what went wrong)")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: str
    model: str | None = None
    detail: str | None = None
