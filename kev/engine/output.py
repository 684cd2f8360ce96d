"""OutputProcessor: from each step's QuestionOutputs to text, stream deltas, shadow checks and Results.

It owns everything a question's answer looks like from outside: detokenizing, stop strings
(a stop string ends the question through the scheduler), the deltas it streams (holding back
what could still become a stop string), logprobs, the comparison of a shadow re-run with the
answer it verifies, and the Result. Every event of every request goes out through
Request.publish: into its request's queue (Engine.stream) and to the engine's listeners.
It needs no model: feed it QuestionOutputs, logits rows and a tokenizer.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kev.results.audit_records import result_fields
from kev.results.result import Result, question_field
from kev.engine.logprobs import LogitRows, TokenTexts, prompt_entries, sampled_entry
from kev.engine.question import ABORTED, Question
from kev.engine.request import EventListener, Request, StreamEvent
from kev.engine.plan import QuestionOutput
from kev.engine.kv.audit import Alert, AuditLog
from kev.model.tokenizer import IncrementalDecoder, Tokenizer

REPLACEMENT = "\ufffd"  # what a partial UTF-8 sequence decodes to


def stop_prefix_length(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of text that could still grow into a stop string (the longest such suffix)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - n:]):
                longest = n
                break
    return longest


@dataclass
class AnswerState:
    """The outside view of one question's answer, while it runs."""

    decoder: IncrementalDecoder
    text: str = ""
    num_sent_chars: int = 0  # text streamed so far
    num_sent_tokens: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)  # kept to record them or to compare a shadow re-run
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    prompt_logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class OutputSettings:
    eos_ids: frozenset[int]
    max_context: int
    fingerprint: str  # numerics_fingerprint of every Result
    strategy: str  # the router strategy named in every Result
    record_logits: bool = False


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, settings: OutputSettings, requests: dict[str, Request], audit: AuditLog,
                 stop: Callable[[Question, int | None], None]) -> None:
        """stop(question, num_tokens): the scheduler's stop_at_string, called when the text reaches a stop string
        (num_tokens: where the answer ends when the step added tokens after that one)."""
        self.tokenizer, self.settings, self.requests, self.audit, self.stop = tokenizer, settings, requests, audit, stop
        self.texts = TokenTexts(tokenizer)
        self.listeners: list[EventListener] = []  # called with every event, the engine lock held: must not block
        self._states: dict[Question, AnswerState] = {}
        self._held: dict[Question, tuple[Result, list[torch.Tensor]]] = {}  # answers waiting for their shadow re-run

    def process(self, outputs: list[QuestionOutput], logits: LogitRows | None = None) -> None:
        if logits is not None and logits.chunks:
            live = {id(o.question) for o in outputs}  # finished this step: their prompt rows still count
            for w, chunk in logits.chunks:
                q = w.question
                if not q.is_finished or id(q) in live:
                    top = q.sampling.logprobs or 0
                    self._state(q).prompt_logprobs += prompt_entries(q.prompt_ids, w.start, chunk, top, self.texts)
        stopped: set[int] = set()  # questions a stop string ended this step: their later tokens never were
        for i, out in enumerate(outputs):
            q = out.question
            if id(q) in stopped:
                continue
            state = self._state(q)
            if out.new_token_ids:
                assert logits is not None and out.sample_row is not None
                if self._add_token(out, state, logits.sampling[out.sample_row]):
                    stopped.add(id(q))
            if id(q) not in stopped and i + 1 < len(outputs) and outputs[i + 1].question is q:
                continue  # a drafted step's tokens: one event (or the result) after its last
            if q.is_finished:
                self._finish(q, state)
            else:
                self._emit(q, state, final=False)

    def reject(self, request: Request, result: Result) -> None:
        """A question refused at submit: its error result, as its final event."""
        result.started_at = result.finished_at = time.time()
        result.strategy = self.settings.strategy
        self._deliver(request, result)

    def _state(self, q: Question) -> AnswerState:
        state = self._states.get(q)
        if state is None:
            state = self._states[q] = AnswerState(self.tokenizer.incremental_decoder())
        return state

    def _add_token(self, out: QuestionOutput, state: AnswerState, row: torch.Tensor) -> bool:
        """True when a stop string ended the question at this token."""
        q, (token,) = out.question, out.new_token_ids
        if self.settings.record_logits or q.shadow or q.shadow_of is not None:
            state.logits.append(row.clone())
        if q.sampling.logprobs is not None:
            state.logprobs.append(sampled_entry(row, token, q.sampling.logprobs, self.texts))
        if token in self.settings.eos_ids and not q.sampling.ignore_eos:
            return False  # EOS ends the answer; it is no part of its text
        state.text += state.decoder.push(token)
        if out.finish_reason == "stop":
            return False  # a structured output that is whole
        for stop in q.sampling.stop:
            cut = state.text.find(stop)
            if cut >= 0:
                state.text = state.text[:cut + (len(stop) if q.sampling.include_stop_str_in_output else 0)]
                self.stop(q, out.num_tokens if out.num_tokens < len(q.output_ids) else None)
                return True
        if out.finish_reason == "length" and len(q.output_ids) < q.sampling.token_limit:
            self.audit.alert(Alert("truncation_near_boundary",
                                   f"request {q.request_id} question {q.index}: answer cut at channel {q.channel_id}'s "
                                   f"context boundary ({self.settings.max_context} tokens)"))
        return False

    def _emit(self, q: Question, state: AnswerState, final: bool) -> None:
        """Send the text not yet streamed; hold back what could still become a stop string."""
        if q.shadow_of is not None:
            return  # a shadow re-run streams nothing
        held = 0 if final else stop_prefix_length(state.text, q.sampling.stop)
        safe, sent, sent_tokens = len(state.text) - held, state.num_sent_chars, state.num_sent_tokens
        request = self.requests.get(q.request_id)
        if (safe > sent or final) and request is not None:
            request.publish(StreamEvent(q.index, q.channel_id, state.text[sent:max(safe, sent)],
                                        q.output_ids[sent_tokens:], logprobs=state.logprobs[sent_tokens:],
                                        request_id=q.request_id), self.listeners)
            state.num_sent_chars, state.num_sent_tokens = max(safe, sent), len(q.output_ids)

    def _finish(self, q: Question, state: AnswerState) -> None:
        """The question is finished: flush its text, build its Result, hand it to its request (or hold it)."""
        if q.finish_reason != "stop" or not q.sampling.stop:
            tail = state.decoder.flush()
            # An answer cut short (max_tokens, the context, a timeout, a cancel) may end inside a character: its
            # partial bytes (they decode as U+FFFD) stay out of the text and the deltas; the token ids keep them.
            state.text += tail.rstrip(REPLACEMENT) if q.finish_reason in ABORTED or q.finish_reason == "length" \
                else tail
        self._emit(q, state, final=True)
        del self._states[q]
        result = self._result(q, state)
        if q.shadow_of is not None:
            self._verify(q.shadow_of, q, state.logits)
        elif q.shadow and q.status == "ok":
            self._held[q] = (result, state.logits)  # delivered once the shadow re-run has verified it
        elif (request := self.requests.get(q.request_id)) is not None:
            self._deliver(request, result)

    def _result(self, q: Question, state: AnswerState) -> Result:
        elapsed = ((q.finished_mono or time.monotonic()) - q.started_mono) * 1000 if q.started_mono else 0.0
        queued = ((q.started_at or q.finished_at or time.time()) - q.submitted_at) * 1000
        ttft, tpot = _token_times(q, queued)
        return Result(
            request_id=q.request_id, index=q.index, text=state.text, token_ids=list(q.output_ids),
            prompt_tokens=len(q.prompt_ids), completion_tokens=len(q.output_ids), channel_id=q.channel_id,
            elapsed_ms=round(elapsed, 3), started_at=q.started_at, finished_at=q.finished_at,
            finish_reason=q.finish_reason, status=q.status, error=q.error, error_field=question_field(q.error),
            isolation=q.isolation,
            strategy=self.settings.strategy, original_text=q.original_text,
            numerics_fingerprint=self.settings.fingerprint,
            logits=torch.stack(state.logits) if state.logits and self.settings.record_logits else None,
            normalized_text=q.normalized_text, hash_bucket=q.features.bucket if q.features else None,
            rerouted=q.rerouted, category=q.features.category if q.features else None, queue_ms=round(queued, 3),
            logprobs=list(state.logprobs) if q.sampling.logprobs is not None else None,
            prompt_logprobs=list(state.prompt_logprobs) if q.sampling.prompt_logprobs else None,
            ttft_ms=ttft, tpot_ms=tpot,
        )

    def _verify(self, original: Question, shadow: Question, shadow_logits: list[torch.Tensor]) -> None:
        """Compare the packed answer with its solo re-run, token by token and logit by logit."""
        result, logits = self._held.pop(original)
        steps = max(len(original.output_ids), len(shadow.output_ids))
        first_diff = next((i for i in range(steps) if i >= len(original.output_ids) or i >= len(shadow.output_ids)
                           or original.output_ids[i] != shadow.output_ids[i]
                           or not torch.equal(logits[i], shadow_logits[i])), None)
        verified = shadow.status == "ok" and first_diff is None
        result.isolation_verified = verified
        self.audit.write("shadow", request_id=original.request_id, index=original.index,
                         channel_id=original.channel_id, isolation_verified=verified, first_differing_step=first_diff)
        if not verified:
            self.audit.alert(Alert("shadow_mismatch", f"request {original.request_id} question {original.index}: "
                                   f"packed answer differs from its solo re-run at step {first_diff}",
                                   [original.channel_id] if original.channel_id is not None else []))
        if (request := self.requests.get(original.request_id)) is not None:
            self._deliver(request, result)

    def _deliver(self, request: Request, result: Result) -> None:
        asked = request.questions.get(result.index)  # whose answer: the operator reads the log per tenant
        self.audit.write("result", tenant=asked.tenant if asked is not None else None,
                         **result_fields(result, self.audit.level))
        request.add_result(result, self.listeners)


def _token_times(q: Question, queued_ms: float) -> tuple[float | None, float | None]:
    """Time to first token (submit → first token, queue included) and the mean time between later tokens, in ms."""
    if q.first_token_mono is None or q.started_mono is None:
        return None, None
    ttft = queued_ms + (q.first_token_mono - q.started_mono) * 1000
    gaps = len(q.output_ids) - 1
    tpot = (q.last_token_mono - q.first_token_mono) * 1000 / gaps if gaps > 0 and q.last_token_mono else None
    return round(ttft, 3), (round(tpot, 3) if tpot is not None else None)
