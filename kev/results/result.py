"""Result: what a user gets back for one question, with the audit fields of SPEC §4."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "timeout", "cancelled", "rejected", "error"]
FinishReason = Literal["stop", "length", "timeout", "cancelled", "error"]
# A question's own input at fault: its error begins with the field ("queries[2].structured_outputs: ...").
_QUESTION_FIELD = re.compile(r"^(queries\[\d+\][\w.\[\]]*): ")


@dataclass
class Result:
    request_id: str
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # completion tokens (EOS included when hit)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    channel_id: int | None = None
    elapsed_ms: float = 0.0
    started_at: float | None = None  # unix seconds
    finished_at: float | None = None
    finish_reason: FinishReason | None = None
    status: Status = "ok"
    error: str | None = None
    # Set when the error is the caller's input (a 400 on the OpenAI routes): the question's field at fault, e.g.
    # "queries[0].structured_outputs"; None for the engine's own failures (a 500 there).
    error_field: str | None = None
    isolation: str = "strict"
    strategy: str = ""
    hash_bucket: int | None = None
    category: str | None = None  # the router.categories group it was routed in
    rerouted: bool = False
    queue_ms: float = 0.0  # submit → start in its channel (or → its end, if it never started)
    ttft_ms: float | None = None  # submit → first token (queue included); None without one
    tpot_ms: float | None = None  # mean time between its output tokens after the first; None under two tokens
    original_text: str | None = None
    normalized_text: str | None = None
    numerics_fingerprint: str = ""
    isolation_verified: bool | None = None
    worker: str | None = None  # distributed: the worker that answered (channel_id is that worker's channel)
    # logprobs=k: per completion token {token_id, token, bytes, logprob, top_logprobs: [{token_id, token, bytes,
    # logprob}]}, of the model's distribution before temperature, top-k/top-p and any grammar mask.
    logprobs: list[dict[str, Any]] | None = None
    prompt_logprobs: list[dict[str, Any]] | None = None  # the same per prompt token; the first has logprob None
    logits: Any = None  # [completion_tokens, vocab] fp32 tensor, only when the engine records logits

    @property
    def tokens(self) -> int:
        """Prompt + completion: the article's token consumption."""
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("logits")
        data["tokens"] = self.tokens
        return data


def question_field(error: str | None) -> str | None:
    """The field a question's error names when the caller's input is at fault (Kev's own failures name none)."""
    match = _QUESTION_FIELD.match(error or "")
    return match.group(1) if match else None
