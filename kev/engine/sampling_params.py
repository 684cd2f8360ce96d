"""How one question samples its tokens: a frozen, validated value (kev.engine.inputs.validate_sampling makes it from
a request's options). A leaf module: the engine, the server and the cluster messages all read it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
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

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def is_greedy(self) -> bool:
        # Below 1e-5, logits / temperature overflows to inf and softmax to NaN: greedy is the limit anyway.
        return self.temperature < 1e-5
