"""Turn what a user passed to submit() into validated question specs.

A question is a string, a list of chat messages, or a dict {"text" | "messages" |
"prompt", plus per-question overrides}. One bad question becomes an error result
naming the field; it never fails its neighbours.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kev.engine.question import SamplingParams

OVERRIDES = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "timeout_ms", "priority"}
CONTENT_KEYS = ("text", "messages", "prompt")


class QuestionError(ValueError):
    """One question's own input is wrong; becomes that question's error result."""


@dataclass
class RequestDefaults:
    max_tokens: int
    max_tokens_cap: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    timeout_ms: int = 10000
    system: str | None = None
    timeout_ms_cap: int = 600_000


@dataclass
class QuestionSpec:
    messages: list[dict[str, str]] | None  # chat messages, rendered with the chat template
    raw_prompt: str | None  # a prompt used as-is (no template)
    original_text: str
    sampling: SamplingParams
    timeout_ms: int
    priority: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def parse_question(raw: Any, index: int, defaults: RequestDefaults) -> QuestionSpec:
    where = f"queries[{index}]"
    options: dict[str, Any] = {}
    if isinstance(raw, str):
        messages, prompt = [{"role": "user", "content": _text(raw, where)}], None
    elif isinstance(raw, list):
        messages, prompt = _messages(raw, where), None
    elif isinstance(raw, dict):
        unknown = set(raw) - OVERRIDES - set(CONTENT_KEYS)
        if unknown:
            raise QuestionError(f"{where}: unknown field(s) {sorted(unknown)}")
        present = [k for k in CONTENT_KEYS if k in raw]
        if len(present) != 1:
            raise QuestionError(f"{where}: needs exactly one of 'text', 'messages' or 'prompt' (got {present or 'none'})")
        key = present[0]
        messages, prompt = None, None
        if key == "text":
            messages = [{"role": "user", "content": _text(raw["text"], f"{where}.text")}]
        elif key == "messages":
            messages = _messages(raw["messages"], f"{where}.messages")
        else:
            prompt = _text(raw["prompt"], f"{where}.prompt")
        options = {k: raw[k] for k in OVERRIDES if k in raw}
    else:
        raise QuestionError(f"{where}: must be a string, a list of messages or a dict, got {type(raw).__name__}")
    if messages is not None and defaults.system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": defaults.system}, *messages]
    original = prompt if prompt is not None else messages[-1]["content"]  # type: ignore[index]
    return QuestionSpec(messages, prompt, original, _sampling(options, defaults, where),
                        validate_timeout(options.get("timeout_ms", defaults.timeout_ms), defaults.timeout_ms_cap, where + "."),
                        _int(options.get("priority", 0), f"{where}.priority", None))


def validate_timeout(timeout_ms: Any, cap: int, where: str) -> int:
    timeout_ms = _int(timeout_ms, f"{where}timeout_ms", 1)
    if timeout_ms > cap:
        raise QuestionError(f"{where}timeout_ms: {timeout_ms} exceeds the cap router.timeout_ms_cap={cap}")
    return timeout_ms


def validate_sampling(max_tokens: Any, temperature: Any, top_p: Any, top_k: Any, seed: Any, stop: Any, cap: int, where: str) -> SamplingParams:
    """Shared by request-level and question-level overrides so both give the same messages."""
    max_tokens = _int(max_tokens, f"{where}max_tokens", 1)
    if max_tokens > cap:
        raise QuestionError(f"{where}max_tokens: {max_tokens} exceeds the cap router.max_tokens_cap={cap}")
    temperature = _number(temperature, f"{where}temperature", 0.0, 100.0)
    top_p = _number(top_p, f"{where}top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise QuestionError(f"{where}top_p: must be > 0 (got 0)")
    top_k = _int(top_k, f"{where}top_k", 0)
    if seed is not None:
        seed = _int(seed, f"{where}seed", 0)
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise QuestionError(f"{where}stop: must be a non-empty string or a list of them")
    return SamplingParams(max_tokens, temperature, top_p, top_k, seed, tuple(stop))


def _sampling(options: dict[str, Any], d: RequestDefaults, where: str) -> SamplingParams:
    pick = lambda key, default: options.get(key, default)  # noqa: E731
    return validate_sampling(pick("max_tokens", d.max_tokens), pick("temperature", d.temperature), pick("top_p", d.top_p),
                             pick("top_k", d.top_k), pick("seed", d.seed), pick("stop", d.stop), d.max_tokens_cap, where + ".")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise QuestionError(f"{where}: must be a string, got {type(value).__name__}")
    if not value.strip():
        raise QuestionError(f"{where}: is empty")
    return value


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise QuestionError(f"{where}: must be a non-empty list of {{'role', 'content'}} messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"} or "role" not in message:
            raise QuestionError(f"{where}[{i}]: must be a dict with 'role' and 'content'")
        if message["role"] not in ("system", "user", "assistant", "tool"):
            raise QuestionError(f"{where}[{i}].role: unknown role {message['role']!r}")
        if not isinstance(message.get("content"), str):
            raise QuestionError(f"{where}[{i}].content: must be a string")
    if not any(m["content"].strip() for m in value):
        raise QuestionError(f"{where}: every message is empty")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _int(value: Any, where: str, minimum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QuestionError(f"{where}: must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise QuestionError(f"{where}: must be >= {minimum}, got {value}")
    return value


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise QuestionError(f"{where}: must be a number in [{low}, {high}], got {value!r}")
    return float(value)
