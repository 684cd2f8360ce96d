"""The errors a Kev user can catch. Each message names the field or value at fault."""
from __future__ import annotations

import errno


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


class DamagedModelError(KevError, ValueError):
    """A model file Kev cannot read as what it should be (a truncated or broken config.json, a cache that does not
    match its manifest, with no source to rebuild it from). The message names the file."""


class EngineFailedError(KevError):
    """The engine can no longer compute (a tensor-parallel rank died or fell out of step): it failed the questions
    it held and takes no more; the message says which rank and why."""


_OS_ADVICE = {
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "permission denied: fix its permissions or choose another path",
    errno.EPERM: "not permitted: fix its permissions or choose another path",
    errno.ENOSPC: "no space left on the device: free some space and run again (what was written is kept)",
    errno.EDQUOT: "disk quota exceeded: free some space and run again (what was written is kept)",
    errno.ENOENT: "no such file or folder: create it or fix the path",
    errno.ENOTDIR: "a part of the path is not a folder: fix the path",
    errno.EISDIR: "it is a folder: give a file",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or lower the concurrency",
    errno.ENFILE: "too many open files on the system: raise the limit or lower the concurrency",
}


def describe_os_error(err: OSError, path: object = None) -> str:
    """One line for a file-system error met in normal operation: the path and what to do."""
    where = err.filename if err.filename is not None else path
    advice = _OS_ADVICE.get(err.errno or 0, err.strerror or str(err))
    return f"{where}: {advice}" if where is not None else advice
