"""The errors a Kev user can catch. Each message names the field or value at fault."""


class KevError(Exception):
    """Base class of every error Kev raises on purpose."""


class ConfigError(KevError, ValueError):
    """A configuration that cannot work; raised at load, never later."""


class InvalidRequestError(KevError, ValueError):
    """A submit() whose request-level arguments are wrong (not one question's fault)."""


class QuestionError(ValueError):
    """One question's own input is wrong; becomes that question's error result (its neighbours are answered)."""


CONTEXT_OVERFLOW = "the prompt and at least one new token must fit"  # in its message: how a result is told apart


class ContextOverflowError(QuestionError):
    """The prompt leaves no room for a new token in core.max_context (a caller's mistake: kev_rejects_total
    {reason="context_overflow"})."""


class RejectedError(KevError):
    """The channel pool is full and the overflow policy said no.

    retry_after_s: when a retry may succeed, if the rejecter knows (the server's Retry-After otherwise)."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverflowTimeoutError(KevError, TimeoutError):
    """overflow_policy `wait`: no channel had room for a question within its timeout."""


class UnknownRequestError(KevError, KeyError):
    """A request_id that this engine never issued (or already forgot)."""


class UnavailableError(KevError):
    """The backend cannot take work now (the message queue is unreachable); retry later."""


class UnsupportedModelError(KevError, ValueError):
    """A model Kev cannot run: an architecture, a GGUF tensor type or tokenizer it does not know, or no weights.
    The message names the thing and what is supported."""


class EngineFailedError(KevError):
    """The engine can no longer compute (a tensor-parallel rank died or fell out of step): it failed the questions
    it held and takes no more; the message says which rank and why."""
