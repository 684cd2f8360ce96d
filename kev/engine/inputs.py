"""Turn what a user passed to submit() into validated question specs.

A question is a string, a list of chat messages, or a dict {"text" | "messages" |
"prompt", plus per-question overrides}. One bad question becomes an error result
naming the field; it never fails its neighbours.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from kev.engine.drafts import parse_speculative
from kev.engine.sampling_params import OPTION_NAMES, SamplingParams
from kev.errors import QuestionError

OVERRIDES = {*OPTION_NAMES, "timeout_ms", "priority"}  # what a question (a dict) may set for itself
MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI caps top_logprobs
CONTENT_KEYS = ("text", "messages", "prompt", "prompt_ids")


@dataclass
class RequestDefaults:
    sampling: SamplingParams
    max_tokens_cap: int
    timeout_ms: int | None = None  # None: no deadline
    system: str | None = None
    system_is_public: bool = False  # the operator's config system prompt, not the caller's
    timeout_ms_cap: int = 600_000


@dataclass
class QuestionSpec:
    messages: list[dict[str, str]] | None  # chat messages, rendered with the chat template
    raw_prompt: str | None  # a prompt used as-is (no template)
    original_text: str | None
    sampling: SamplingParams
    timeout_ms: int | None
    priority: int = 0
    prompt_ids: list[int] | None = None  # token ids used as-is


def parse_question(raw: Any, index: int, defaults: RequestDefaults) -> QuestionSpec:
    where = f"queries[{index}]"
    options: dict[str, Any] = {}
    if isinstance(raw, str):
        messages, prompt, prompt_ids = [{"role": "user", "content": _text(raw, where)}], None, None
    elif isinstance(raw, list):
        messages, prompt, prompt_ids = _messages(raw, where), None, None
    elif isinstance(raw, dict):
        unknown = set(raw) - OVERRIDES - set(CONTENT_KEYS)
        if unknown:
            raise QuestionError(f"{where}: unknown field(s) {sorted(unknown)}")
        present = [k for k in CONTENT_KEYS if k in raw]
        if len(present) != 1:
            raise QuestionError(f"{where}: needs exactly one of {', '.join(CONTENT_KEYS)} (got {present or 'none'})")
        key = present[0]
        messages, prompt, prompt_ids = None, None, None
        if key == "text":
            messages = [{"role": "user", "content": _text(raw["text"], f"{where}.text")}]
        elif key == "messages":
            messages = _messages(raw["messages"], f"{where}.messages")
        elif key == "prompt":
            prompt = _text(raw["prompt"], f"{where}.prompt")
        else:
            prompt_ids = _token_ids(raw["prompt_ids"], f"{where}.prompt_ids")
        options = {k: raw[k] for k in OVERRIDES if k in raw}
    else:
        raise QuestionError(f"{where}: must be a string, a list of messages or a dict, got {type(raw).__name__}")
    if messages is not None and defaults.system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": defaults.system}, *messages]
    original = prompt if prompt is not None else (messages[-1]["content"] if messages else None)
    sampling = validate_sampling(options, defaults.sampling, defaults.max_tokens_cap, where + ".")
    return QuestionSpec(messages, prompt, original, sampling,
                        validate_timeout(options.get("timeout_ms", defaults.timeout_ms), defaults.timeout_ms_cap,
                                         where + "."),
                        _int(options.get("priority", 0), f"{where}.priority", None), prompt_ids)


def validate_timeout(timeout_ms: Any, cap: int, where: str) -> int | None:
    if timeout_ms is None:
        return None  # no deadline
    timeout_ms = _int(timeout_ms, f"{where}timeout_ms", 1)
    if timeout_ms > cap:
        raise QuestionError(f"{where}timeout_ms: {timeout_ms} exceeds the cap router.timeout_ms_cap={cap}")
    return timeout_ms


def _token_ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise QuestionError(f"{where}: must be a non-empty list of token ids (non-negative integers)")
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise QuestionError(f"{where}[{i}]: must be a token id (a non-negative integer), got {token!r}")
    return value


def validate_sampling(values: Mapping[str, Any], base: SamplingParams, cap: int, where: str) -> SamplingParams:
    """base with the given overrides applied (None: base's), every value checked; shared by request- and
    question-level checks so both give the same messages. base.max_tokens must be set."""
    pick = lambda key: values[key] if values.get(key) is not None else getattr(base, key)  # noqa: E731
    max_tokens, temperature, top_p, top_k = pick("max_tokens"), pick("temperature"), pick("top_p"), pick("top_k")
    seed, stop, ignore_eos = pick("seed"), pick("stop"), pick("ignore_eos")
    logprobs, prompt_logprobs = pick("logprobs"), pick("prompt_logprobs")
    if logprobs is not None:
        logprobs = _int(logprobs, f"{where}logprobs", 0)
        if logprobs > MAX_LOGPROBS:
            raise QuestionError(f"{where}logprobs: at most {MAX_LOGPROBS} alternatives per token, got {logprobs}")
    if not isinstance(prompt_logprobs, bool):
        raise QuestionError(f"{where}prompt_logprobs: must be true or false, got {prompt_logprobs!r}")
    # max_tokens 0 scores the prompt and generates nothing (OpenAI's echo with max_tokens 0).
    max_tokens = _int(max_tokens, f"{where}max_tokens", 0 if prompt_logprobs else 1)
    if max_tokens > cap:
        raise QuestionError(f"{where}max_tokens: {max_tokens} exceeds the cap router.max_tokens_cap={cap}")
    temperature = _number(temperature, f"{where}temperature", 0.0, 100.0)
    top_p = _number(top_p, f"{where}top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise QuestionError(f"{where}top_p: must be > 0 (got 0)")
    top_k = _int(top_k, f"{where}top_k", 0)
    if seed is not None:
        seed = _int(seed, f"{where}seed", 0)
        if seed >= 2**63:
            raise QuestionError(f"{where}seed: must be < 2**63, got {seed}")
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise QuestionError(f"{where}stop: must be a non-empty string or a list of them")
    if not isinstance(ignore_eos, bool):
        raise QuestionError(f"{where}ignore_eos: must be true or false, got {ignore_eos!r}")
    presence = _number(pick("presence_penalty"), f"{where}presence_penalty", -2.0, 2.0)
    frequency = _number(pick("frequency_penalty"), f"{where}frequency_penalty", -2.0, 2.0)
    structured = pick("structured_outputs")  # its shape is checked where it is compiled (kev.engine.structured)
    include_stop = pick("include_stop_str_in_output")
    if not isinstance(include_stop, bool):
        raise QuestionError(f"{where}include_stop_str_in_output: must be true or false, got {include_stop!r}")
    return SamplingParams(max_tokens, temperature, top_p, top_k, seed, tuple(stop), ignore_eos, logprobs,
                          prompt_logprobs,
                          _logit_bias(pick("logit_bias"), f"{where}logit_bias"), presence, frequency, structured,
                          include_stop,
                          parse_speculative(pick("speculative"), f"{where}speculative"))


def request_sampling(params: SamplingParams, default_max_tokens: int, cap: int) -> SamplingParams:
    """A request's SamplingParams, checked as a question's overrides are, its max_tokens filled in."""
    values = {key: getattr(params, key) for key in OPTION_NAMES}
    return validate_sampling(values, SamplingParams(max_tokens=default_max_tokens), cap, "")


def _logit_bias(value: Any, where: str) -> tuple[tuple[int, float], ...]:
    """{token id (an int or its decimal string, as OpenAI's JSON has it): bias in [-100, 100]}, or its sorted pairs."""
    if isinstance(value, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in value):
        value = dict(value)
    if not isinstance(value, dict):
        raise QuestionError(f"{where}: must be an object mapping token ids to biases")
    pairs = []
    for key, bias in value.items():
        # ASCII digits only: str.isdigit() also takes '²', which int() then refuses (a 500, found by schemathesis)
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else key
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise QuestionError(f"{where}: key {key!r} is not a token id")
        pairs.append((token, _number(bias, f"{where}[{key!r}]", -100.0, 100.0)))
    return tuple(sorted(pairs))


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise QuestionError(f"{where}: must be a string, got {type(value).__name__}")
    if not value.strip():
        raise QuestionError(f"{where}: is empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise QuestionError(f"{where}: is not valid Unicode text (a lone surrogate)") from None
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
