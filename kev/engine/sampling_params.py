"""How one question samples its tokens: one frozen value that Engine.submit takes, the HTTP routes and `kev batch`
build, and the cluster's work items carry. A leaf module: the engine, the server and the cluster messages all read it.

The engine validates it at submit (kev.engine.inputs.validate_sampling, the only place the rules live) and fills in
`max_tokens` when it is None; a question's own overrides (a dict in the question) are applied over it there too."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from kev.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None  # None: the engine's router.default_max_tokens (filled in at submit)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks)
    logprobs: int | None = None  # None: none; k: each new token's logprob and its k most likely alternatives
    prompt_logprobs: bool = False  # also the logprob of every prompt token (after the first); allows max_tokens 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), sorted by id
    presence_penalty: float = 0.0  # subtracted from the logit of every token already generated
    frequency_penalty: float = 0.0  # times the number of times it was generated
    # One of json / json_object / regex / choice / grammar (kev.engine.structured compiles it at submit).
    structured_outputs: Mapping[str, Any] | None = None
    include_stop_str_in_output: bool = False  # vLLM's: a stop string that ends the answer stays in its text
    # Prompt-lookup drafts for this question (kev.engine.drafts.parse_speculative's form); None: the config's
    # `speculative` section. They change how many positions a step computes, never a token or a logit.
    speculative: Mapping[str, Any] | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SamplingParams:
        """From keyword options or a JSON object (a cluster work item); an unknown name is an error naming it.
        Values are checked by the engine at submit, so this accepts what JSON holds (lists for tuples)."""
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise InvalidRequestError(f"{unknown[0]}: not a submit option (sampling: {', '.join(OPTION_NAMES)})")
        values = {key: value for key, value in options.items() if value is not None}
        if isinstance(values.get("stop"), list):
            values["stop"] = tuple(values["stop"])
        if isinstance(values.get("logit_bias"), list):  # JSON's pairs
            values["logit_bias"] = tuple(tuple(p) if isinstance(p, list) else p for p in values["logit_bias"])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """Only what differs from the defaults, as plain JSON values (from_options reads it back)."""
        return {key: value for key, value in asdict(self).items() if value != getattr(_DEFAULT, key)}

    def with_max_tokens(self, max_tokens: int) -> SamplingParams:
        return self if self.max_tokens is not None else replace(self, max_tokens=max_tokens)

    @property
    def token_limit(self) -> int:
        """max_tokens once the engine has filled in its default (every question's params have it)."""
        if self.max_tokens is None:
            raise ValueError("max_tokens was not resolved at submit")
        return self.max_tokens

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def is_greedy(self) -> bool:
        # Below 1e-5, logits / temperature overflows to inf and softmax to NaN: greedy is the limit anyway.
        return self.temperature < 1e-5


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams))
_DEFAULT = SamplingParams()


def sampling_of(sampling: SamplingParams | None, options: Mapping[str, Any]) -> SamplingParams:
    """What submit samples with: the object, or its fields given as keywords (built here, the one place), never
    both."""
    if sampling is None:
        return SamplingParams.from_options(options)
    if options:
        raise InvalidRequestError(f"{sorted(options)[0]}: set it in the SamplingParams, not beside it")
    return sampling


REQUEST_OPTIONS = ("isolation", "max_parallel", "timeout_ms", "system", "tenant", "work_class")  # submit()'s own


def split_submit(sampling: SamplingParams | None, options: Mapping[str, Any]) -> tuple[SamplingParams, dict[str, Any]]:
    """submit()'s keywords apart, for the engines that pass them on: the request's own options, and the sampling
    (the object given, or built from the remaining keywords)."""
    request = {key: value for key, value in options.items() if key in REQUEST_OPTIONS}
    rest = {key: value for key, value in options.items() if key not in REQUEST_OPTIONS}
    return sampling_of(sampling, rest), request
