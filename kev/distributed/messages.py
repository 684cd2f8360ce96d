"""The JSON messages between router, workers and aggregator. Every one is validated on receipt:
a message that does not parse is a dead letter (with the reason), never a crash.

Deadlines and request metadata travel inside the messages; times are unix seconds.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from kev.results.result import Result

VERSION: Literal[1] = 1
Token = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]  # goes into a subject: one token


_tag_key: list[bytes] = []  # the cluster secret (deploy.cluster_secret), once this process has connected
TAG_BYTES = 64  # hex of HMAC-SHA256


def use_cluster_secret(secret: str | None) -> None:
    """From connect(): every message this process encodes is tagged, and every one it decodes must be."""
    _tag_key[:] = [secret.encode()] if secret else []


def _tag(body: bytes) -> bytes:
    return hmac.new(_tag_key[0], body, hashlib.sha256).hexdigest().encode()


def seal(body: bytes) -> bytes:
    """body with its authentication tag in front (as is without a cluster secret)."""
    return _tag(body) + b" " + body if _tag_key else body


def unseal(data: bytes, what: str) -> bytes:
    """The body of a sealed message; MalformedMessage when its tag is missing or wrong (a forgery)."""
    if not _tag_key:
        return data
    tag, body = data[:TAG_BYTES], data[TAG_BYTES + 1:]
    if len(data) <= TAG_BYTES or data[TAG_BYTES:TAG_BYTES + 1] != b" " or not hmac.compare_digest(tag, _tag(body)):
        raise MalformedMessage(f"not a valid {what}: its authentication tag (deploy.cluster_secret) is missing or "
                               "wrong")
    return body


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = VERSION

    def encode(self) -> bytes:
        return seal(self.model_dump_json().encode())


class WorkItem(_Message):
    """One question on the work queue (router -> worker)."""

    request_id: Token
    index: int = Field(ge=0)
    question: str | list[Any] | dict[str, Any]  # as the caller gave it; the worker's engine validates it again
    sampling: dict[str, Any] = {}  # the request's SamplingParams (its to_json); a question may override fields
    options: dict[str, Any] = {}  # request-level submit() options: isolation, max_parallel, timeout_ms, system, tenant
    reply: Token  # the router that waits for the answer
    strategy: str = ""
    rerouted: bool = False  # the router's breaker or a full partition moved it off the strategy's pick
    submitted_at: float
    expires_at: float | None = None  # after this nobody waits (the aggregator's timeout placeholder); None: no deadline


class QuestionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    expires_at: float | None = None  # None: no deadline (neither the request nor router.default_timeout_ms set one)
    original_text: str | None = None
    hash_bucket: int | None = None
    category: str | None = None


class RequestRecord(_Message):
    """What the aggregator must know of an open request (router -> KV bucket {p}_requests)."""

    request_id: Token
    reply: Token
    num_questions: int = Field(ge=1)
    isolation: str = "strict"
    strategy: str = ""
    questions: list[QuestionRecord]  # the ones on the queue (the router answers bad questions itself)


class ResultMessage(_Message):
    """A worker's final answer to one question (worker -> results stream)."""

    reply: Token
    worker: Token
    attempt: int = Field(1, ge=1)  # JetStream delivery count of the question
    result: dict[str, Any]

    def to_result(self) -> Result:
        return result_from_dict(self.result)


class DeltaMessage(_Message):
    """A streaming delta of one question (worker -> aggregator, and aggregator -> router).

    Offsets count what this attempt sent before, so a redelivered question's replay can be cut."""

    request_id: Token
    index: int = Field(ge=0)
    reply: Token
    worker: str = ""
    attempt: int = Field(1, ge=1)
    channel_id: int | None = None
    text_offset: int = Field(0, ge=0)
    token_offset: int = Field(0, ge=0)
    text: str = ""
    token_ids: list[int] = []


class AnswerMessage(_Message):
    """An accepted answer (aggregator -> router); seq is its revision in the answers bucket (acceptance order)."""

    seq: int = Field(ge=0)
    result: dict[str, Any]


class OutMessage(_Message):
    kind: Literal["answer", "delta"]
    answer: AnswerMessage | None = None
    delta: DeltaMessage | None = None


class WorkerStatus(_Message):
    """A worker's heartbeat (worker -> routers): who it is, how full, its channels."""

    worker: Token
    partition: int = Field(ge=0)
    capacity: int = Field(ge=0)  # questions it runs at once (router.max_parallel_queries)
    inflight: int = Field(ge=0)
    at: float
    host: str = ""
    pid: int = 0
    channels: list[dict[str, Any]] = []
    queue_length: int = 0
    num_steps: int = 0
    num_tokens_computed: int = 0
    num_tokens_generated: int = 0
    alerts: dict[str, int] = {}  # the engine's audit alert counts by kind
    load: dict[str, int] = {}  # the engine's EngineLoad (running, waiting, KV blocks, prefix cache counters)


class MalformedMessage(ValueError):
    """A message that is not valid JSON of the expected shape; str() is the reason."""


M = TypeVar("M", bound=_Message)


def decode(model: type[M], data: bytes) -> M:
    data = unseal(data, model.__name__)  # a forged item or a spoofed answer: malformed, dropped and counted
    try:
        return model.model_validate_json(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors()[:3])
        raise MalformedMessage(f"not a valid {model.__name__}: {problems}") from None
    except UnicodeDecodeError as err:
        raise MalformedMessage(f"not UTF-8: {err}") from None


def result_from_dict(data: dict[str, Any]) -> Result:
    known = {k: v for k, v in data.items() if k in Result.__dataclass_fields__ and k != "logits"}
    return Result(**known)
