"""The server's limits on what one caller may ask (config `server:`); over a limit is a 413/422 naming the field
and the limit."""
from __future__ import annotations

from dataclasses import dataclass

from kev.config import KevConfig
from kev.engine.sampling_params import SamplingParams
from kev.wire.bodies.api_models import ChatMessage, QuestionObject, SubmitBody
from kev.wire.bodies.errors import ApiError


@dataclass(frozen=True)
class Limits:
    max_questions: int
    max_question_chars: int
    max_tokens_cap: int
    max_timeout_ms: int
    default_max_tokens: int  # router.default_max_tokens, lowered to the server's cap

    @classmethod
    def from_config(cls, config: KevConfig) -> Limits:
        server, router = config.server, config.router
        cap = min(server.max_tokens_cap or router.max_tokens_cap, router.max_tokens_cap)
        return cls(server.max_questions, server.max_question_chars, cap, server.max_timeout_ms,
                   min(router.default_max_tokens, cap))

    def with_default_max_tokens(self, sampling: SamplingParams) -> SamplingParams:
        """The one rule for a call that set no max_tokens: the server's default, within its cap."""
        return sampling.with_max_tokens(self.default_max_tokens)

    def check_count(self, count: int, field: str) -> None:
        if count > self.max_questions:
            raise ApiError(413, f"{field}: {count} questions; the limit is server.max_questions={self.max_questions}",
                           field)

    def check_chars(self, num_chars: int, field: str, summed: bool | None = None) -> None:
        """One string over the limit is a 422 (the published schema's maxLength says it); a sum over several strings
        (messages: no JSON Schema keyword can say it) is a 413. summed None: only `messages` fields are sums."""
        if num_chars > self.max_question_chars:
            summed = field.endswith("messages") if summed is None else summed
            raise ApiError(413 if summed else 422, f"{field}: {num_chars} characters; the limit is "
                                                   f"server.max_question_chars={self.max_question_chars}", field)

    def check_max_tokens(self, value: int | None, field: str) -> None:
        if value is not None and value > self.max_tokens_cap:
            raise ApiError(422, f"{field}: {value} exceeds the limit max_tokens_cap={self.max_tokens_cap}", field)

    def check_timeout(self, value: int | None, field: str) -> None:
        if value is not None and value > self.max_timeout_ms:
            raise ApiError(422, f"{field}: {value} exceeds the limit server.max_timeout_ms={self.max_timeout_ms}",
                           field)

    def check_submit(self, body: SubmitBody) -> None:
        self.check_count(len(body.queries), "queries")
        self.check_max_tokens(body.max_tokens, "max_tokens")
        self.check_timeout(body.timeout_ms, "timeout_ms")
        if body.system is not None:
            self.check_chars(len(body.system), "system")
        for i, question in enumerate(body.queries):
            where = f"queries[{i}]"
            self.check_chars(question_chars(question), where, summed=not is_one_string(question))
            if isinstance(question, QuestionObject):
                self.check_max_tokens(question.max_tokens, f"{where}.max_tokens")
                self.check_timeout(question.timeout_ms, f"{where}.timeout_ms")


def is_one_string(question: str | list[ChatMessage] | QuestionObject) -> bool:
    """A question whose characters are one string's (bounded by the schema's maxLength), not a sum of messages."""
    return isinstance(question, str) or (isinstance(question, QuestionObject) and not question.messages)


def question_chars(question: str | list[ChatMessage] | QuestionObject) -> int:
    if isinstance(question, str):
        return len(question)
    if isinstance(question, list):
        return sum(len(m.content) for m in question)
    return len(question.text or question.prompt or "") + sum(len(m.content) for m in question.messages or [])
