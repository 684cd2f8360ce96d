"""What a question is: its ids, sampling, routing, timings and status. Only the scheduler changes its state
(waiting → prefill → decode → finished); its text, stream offsets and logprobs belong to the output processor."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kev.results.result import FinishReason, Status
from kev.engine.sampling_params import SamplingParams
from kev.router.features import QuestionFeatures

if TYPE_CHECKING:  # torch stays out of bookkeeping; structured (llguidance) is only a type here
    import torch

    from kev.engine.drafts import PromptLookup
    from kev.engine.structured import ChannelGrammar, CompiledGrammar
    from kev.engine.kv.prefix_store import PrefixEntry


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


ABORTED: frozenset[FinishReason] = frozenset({"timeout", "cancelled", "error"})  # cut short from outside


def status_of(reason: FinishReason) -> Status:
    """A Result's status: "ok" for an answer that ended on its own (stop, length), else the reason itself."""
    return "ok" if reason in ("stop", "length") else reason  # type: ignore[return-value]  # the three others are statuses


@dataclass(eq=False)  # identity: two questions are never "equal"
class Question:
    request_id: str
    index: int
    prompt_ids: list[int]
    sampling: SamplingParams
    timeout_ms: int | None  # counted from the moment the question enters its channel; None: no deadline
    priority: int = 0
    isolation: str = "strict"
    original_text: str | None = None
    prefix_ids: list[int] = field(default_factory=list)  # declared shared prefix (system prompt), if any
    prefix_public: bool = False  # the prefix is the operator's config system prompt (loose may cache it)
    tenant: str = "default"  # the caller's (server.api_keys): loose caches a private prefix only for its tenant
    work_class: str = "live"  # live, or batch (a server batch's line): when it starts, never what it computes
    submitted_at: float = field(default_factory=time.time)
    normalized_text: str | None = None
    features: QuestionFeatures | None = None  # what the router routes on
    seed: int | None = None  # the sampling generator's seed (drawn at random when none was given)
    grammar_spec: CompiledGrammar | None = None  # its structured_outputs (a shadow re-run starts its own matcher)
    shadow: bool = False  # re-run alone after it finishes, to verify isolation
    shadow_of: Question | None = None  # set on the re-run: the question it verifies
    # --- set by the scheduler as it runs ---
    arrival: int | None = None  # submission order; the tie-break after priority
    rerouted: bool = False  # the breaker or a full queue moved it off the strategy's pick
    phase: Phase = Phase.WAITING
    channel_id: int | None = None
    num_computed: int = 0  # tokens whose K/V are in the channel's cache
    prefix: PrefixEntry | None = None  # its shared prefix until the question has attached it
    prefix_len: int = 0  # tokens of prefix attached; chunking restarts there
    output_ids: list[int] = field(default_factory=list)
    started_at: float | None = None
    started_mono: float | None = None
    finished_at: float | None = None
    finished_mono: float | None = None
    first_token_mono: float | None = None  # when its first output token was sampled (TTFT)
    last_token_mono: float | None = None  # ... and its latest (time per output token)
    finish_reason: FinishReason | None = None
    error: str | None = None
    grammar: ChannelGrammar | None = None  # the structured-output state of its channel, dropped at finish
    generator: torch.Generator | None = None  # made by the sampler from seed on first use
    lookup: PromptLookup | bool | None = None  # the scheduler's draft index (False: it does not draft; None: not yet)

    def __post_init__(self) -> None:
        if self.grammar_spec is not None and self.grammar is None:
            self.grammar = self.grammar_spec.start()

    def shadow_copy(self) -> Question:
        """The same question, to be run alone: same prompt, prefix, sampling, seed and constraint."""
        return Question(self.request_id, self.index, list(self.prompt_ids), self.sampling, None, self.priority,
                        self.isolation, self.original_text, list(self.prefix_ids), self.prefix_public, self.tenant,
                        seed=self.seed, grammar_spec=self.grammar_spec, shadow_of=self)

    @property
    def status(self) -> Status:
        return status_of(self.finish_reason) if self.finish_reason is not None else "ok"

    @property
    def deadline(self) -> float | None:
        """time.monotonic() after which the question times out; None while it waits for a channel or without
        a budget."""
        if self.started_mono is None or self.timeout_ms is None:
            return None
        return self.started_mono + self.timeout_ms / 1000

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.phase is Phase.FINISHED
