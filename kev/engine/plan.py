"""What one step runs and what it produced: the scheduler's plan (work in packing order, slot copies) and its
per-question outputs (new token ids and a finish reason). Plain data: the packer, the engine and the output
processor read them; only the scheduler makes them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kev.results.result import FinishReason
from kev.engine.prefix_jobs import PrefixJob, SlotCopy
from kev.engine.question import Question
from kev.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kev.engine.structured import ChannelGrammar


@dataclass
class Work:
    seq: Question | PrefixJob
    start: int  # first position computed this step
    length: int  # tokens computed this step
    samples: bool  # does this step produce the question's next token?
    scores_prompt: bool = False  # every row's logits are wanted (prompt_logprobs)
    # Drafted next tokens (kev.engine.drafts): a decode work of 1 + len(draft) rows, positions start..start+len(draft),
    # each row computed as plain decoding would compute that position; every row's logits are sampled in turn.
    draft: tuple[int, ...] = ()

    @property
    def question(self) -> Question:
        assert isinstance(self.seq, Question)
        return self.seq

    @property
    def argmax_only(self) -> bool:
        """What the model returns for this work is read for its argmax alone: it samples, scores no prompt, and its
        question samples by reads_argmax_only with no logprobs (read under the engine lock, as pack runs)."""
        if not self.samples or self.scores_prompt or not isinstance(self.seq, Question):
            return False
        return reads_argmax_only(self.seq.sampling, self.seq.grammar) and self.seq.sampling.logprobs is None


def reads_argmax_only(params: SamplingParams, grammar: ChannelGrammar | None) -> bool:
    """Sampling takes the raw logits row's argmax and nothing else: greedy, no grammar mask, nothing that changes the
    row first (logit_bias, penalties)."""
    return params.is_greedy and grammar is None and not params.adjusts_logits


@dataclass(frozen=True)
class SampleRow:
    """What sampling reads of one question, copied under the engine lock when the step is planned. Sampling runs
    outside the lock: a cancel that lands meanwhile (and drops the question's grammar) cannot change what it reads."""

    question: Question  # the sampler keeps its generator there: only the step thread ever touches it
    params: SamplingParams
    grammar: ChannelGrammar | None
    output_ids: tuple[int, ...]  # for presence / frequency penalties (empty when the row has none)
    draft: tuple[int, ...] = ()  # the question's drafted tokens this step: 1 + len(draft) logits rows are its own

    @classmethod
    def of(cls, question: Question, draft: tuple[int, ...] = ()) -> SampleRow:
        return cls(question, question.sampling, question.grammar,
                   tuple(question.output_ids) if cls.penalised(question.sampling) else (), draft)

    @staticmethod
    def penalised(params: SamplingParams) -> bool:
        return params.presence_penalty != 0.0 or params.frequency_penalty != 0.0

    def at(self, offset: int) -> SampleRow:
        """What the row `offset` tokens into the draft reads: as if the draft's first `offset` tokens had been
        sampled (a penalty counts them), with no draft of its own."""
        ids = self.output_ids + self.draft[:offset] if self.penalised(self.params) else ()
        return SampleRow(self.question, self.params, self.grammar, ids)


@dataclass
class StepPlan:
    """Everything one step runs: the work in packing order and the K/V slot copies to apply first."""

    work: list[Work] = field(default_factory=list)
    copies: list[SlotCopy] = field(default_factory=list)
    sampling: list[Question] = field(default_factory=list)  # who samples, in the order of the sampled logits rows
    sample_rows: list[SampleRow] = field(default_factory=list)  # what sampling reads of each, snapshotted

    @property
    def num_prefix_tokens(self) -> int:
        return sum(w.length for w in self.work if isinstance(w.seq, PrefixJob))


@dataclass
class QuestionOutput:
    """What one step did to one question: its new token (if any) and, when it ended, why."""

    question: Question
    new_token_ids: list[int]
    finish_reason: FinishReason | None
    sample_row: int | None = None  # its row in the step's sampled logits
    num_tokens: int = 0  # len(question.output_ids) once this token is in (a step may add several: drafts)
