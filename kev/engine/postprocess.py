"""After a forward: append sampled tokens, stream deltas, decide who stops, hand out results."""
from __future__ import annotations

import time

import torch

from kev.aggregator.audit_records import result_fields
from kev.aggregator.result import Result
from kev.engine.engine_setup import EngineParts
from kev.engine.logprobs import LogitRows, TokenTexts, record_prompt, record_sampled
from kev.engine.question import Phase, Question
from kev.engine.request import Request, StreamEvent
from kev.engine.scheduler import Work
from kev.engine.submission import shadow_copy
from kev.isolation.audit import Alert, AuditLog


REPLACEMENT = "\ufffd"  # what a partial UTF-8 sequence decodes to
ABORTED = frozenset({"timeout", "cancelled", "error"})  # finish reasons that cut an answer short


def stop_prefix_length(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of text that could still grow into a stop string (the longest such suffix)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - n:]):
                longest = n
                break
    return longest


class Postprocessor:
    def __init__(self, parts: EngineParts, requests: dict[str, Request], record_logits: bool, audit: AuditLog) -> None:
        self.scheduler, self.requests, self.record_logits, self.audit = parts.scheduler, requests, record_logits, audit
        self.tokenizer = parts.tokenizer
        self.eos_ids = set(parts.tokenizer.eos_token_ids) | set(parts.runner.model.config.eos_token_ids)
        self.max_context = parts.scheduler.limits.max_context
        self.fingerprint = parts.runner.fingerprint
        self.strategy = parts.router.strategy_name
        self.texts = TokenTexts(parts.tokenizer)

    def apply(self, work: list[Work], sampled: list[Question], tokens: list[int], logits: LogitRows) -> None:
        for w in work:
            w.question.num_computed = w.start + w.length
        now = time.monotonic()
        for w, chunk in logits.chunks:
            if not w.question.is_finished:
                record_prompt(w, chunk, self.texts)
        for row, (q, token) in enumerate(zip(sampled, tokens)):
            if q.is_finished:  # cancelled or timed out while the forward ran
                continue
            q.phase = Phase.DECODE
            if q.sampling.max_tokens == 0:  # scoring only: the prompt's logprobs are all it wanted
                self.scheduler.finish(q, "length")
                self.complete(q)
                continue
            q.output_ids.append(token)
            q.first_token_mono, q.last_token_mono = q.first_token_mono or now, now
            if self.record_logits or q.shadow or q.shadow_of is not None:
                q.logits.append(logits.sampling[row].clone())
            record_sampled(q, logits.sampling[row], token, self.texts)
            reason = self._stop_reason(q, token)
            if q.grammar is not None and q.grammar.error:  # never expected: the mask allowed only what it accepts
                self.scheduler.finish(q, "error", "error", f"structured output failed: {q.grammar.error}")
                self.complete(q)
            elif reason:
                self.scheduler.finish(q, reason)
                self.complete(q)
            else:
                self._emit(q, final=False)

    def _stop_reason(self, q: Question, token: int) -> str | None:
        if q.grammar is not None:
            q.grammar.accept(token)
        if token in self.eos_ids and not q.sampling.ignore_eos:
            return "stop"
        q.text += q.decoder.push(token)
        if q.grammar is not None and q.grammar.is_done:  # the constrained text is whole: nothing may follow
            return "stop"
        for stop in q.sampling.stop:
            cut = q.text.find(stop)
            if cut >= 0:
                q.text = q.text[:cut]
                return "stop"
        if len(q.output_ids) >= q.sampling.max_tokens:
            return "length"
        if q.num_tokens >= self.max_context:
            self.audit.alert(Alert("truncation_near_boundary", f"request {q.request_id} question {q.index}: answer cut "
                                   f"at channel {q.channel_id}'s context boundary ({self.max_context} tokens)", []))
            return "length"
        return None

    def _emit(self, q: Question, final: bool) -> None:
        """Send the text not yet streamed; hold back what could still become a stop string."""
        if q.shadow_of is not None:
            return  # a shadow re-run streams nothing
        held = 0 if final else stop_prefix_length(q.text, q.sampling.stop)
        safe = len(q.text) - held
        sent = getattr(q, "_sent", 0)
        sent_tokens = getattr(q, "_sent_tokens", 0)
        if safe > sent or final:
            request = self.requests[q.request_id]
            request.events.put(StreamEvent(q.index, q.channel_id, q.text[sent:max(safe, sent)],
                                           q.output_ids[sent_tokens:], logprobs=q.logprobs[sent_tokens:]))
            q._sent, q._sent_tokens = max(safe, sent), len(q.output_ids)  # type: ignore[attr-defined]

    def complete(self, q: Question) -> None:
        """The question is finished: flush its text, build its Result, hand it to its request."""
        q.grammar = None  # the channel's grammar state goes with the question that held the channel
        if q.finish_reason != "stop" or not q.sampling.stop:
            tail = q.decoder.flush()
            # An answer cut short (timeout, cancel) may end inside a character: drop its partial bytes
            # (they decode as U+FFFD) so the text ends at a character boundary.
            q.text += tail.rstrip(REPLACEMENT) if q.finish_reason in ABORTED else tail
        self._emit(q, final=True)
        elapsed = ((q.finished_mono or time.monotonic()) - q.started_mono) * 1000 if q.started_mono else 0.0
        queued = ((q.started_at or q.finished_at or time.time()) - q.submitted_at) * 1000
        ttft, tpot = _token_times(q, queued)
        result = Result(
            request_id=q.request_id, index=q.index, text=q.text, token_ids=list(q.output_ids),
            prompt_tokens=len(q.prompt_ids), completion_tokens=len(q.output_ids), channel_id=q.channel_id,
            elapsed_ms=round(elapsed, 3), started_at=q.started_at, finished_at=q.finished_at,
            finish_reason=q.finish_reason, status=q.status, error=q.error, isolation=q.isolation,  # type: ignore[arg-type]
            strategy=self.strategy, original_text=q.original_text, numerics_fingerprint=self.fingerprint,
            logits=torch.stack(q.logits) if q.logits and self.record_logits else None,
            normalized_text=q.normalized_text, hash_bucket=q.features.bucket if q.features else None,
            rerouted=q.rerouted, category=q.features.category if q.features else None, queue_ms=round(queued, 3),
            logprobs=list(q.logprobs) if q.sampling.logprobs is not None else None,
            prompt_logprobs=list(q.prompt_logprobs) if q.sampling.prompt_logprobs else None,
            ttft_ms=ttft, tpot_ms=tpot,
        )
        if q.shadow_of is not None:
            self._verify(q.shadow_of, q)
        elif q.shadow and q.status == "ok":
            q.held_result = result  # delivered once the shadow re-run has verified it
            self.scheduler.add(shadow_copy(q, self.tokenizer))
        else:
            self._deliver(self.requests[q.request_id], result)

    def _verify(self, original: Question, shadow: Question) -> None:
        """Compare the packed answer with its solo re-run, token by token and logit by logit."""
        steps = max(len(original.output_ids), len(shadow.output_ids))
        first_diff = next((i for i in range(steps) if i >= len(original.output_ids) or i >= len(shadow.output_ids)
                           or original.output_ids[i] != shadow.output_ids[i]
                           or not torch.equal(original.logits[i], shadow.logits[i])), None)
        verified = shadow.status == "ok" and first_diff is None
        result = original.held_result
        result.isolation_verified = verified
        self.audit.write("shadow", request_id=original.request_id, index=original.index,
                         channel_id=original.channel_id, isolation_verified=verified, first_differing_step=first_diff)
        if not verified:
            self.audit.alert(Alert("shadow_mismatch", f"request {original.request_id} question {original.index}: "
                                   f"packed answer differs from its solo re-run at step {first_diff}",
                                   [original.channel_id] if original.channel_id is not None else []))
        original.logits, shadow.logits = [], []
        self._deliver(self.requests[original.request_id], result)

    def complete_error(self, request: Request, result: Result) -> None:
        result.started_at = result.finished_at = time.time()
        result.strategy = self.strategy
        self._deliver(request, result)

    def _deliver(self, request: Request, result: Result) -> None:
        self.audit.write("result", **result_fields(result, self.audit.level))
        request.add_result(result)

    def expire_deadlines(self) -> None:
        now = time.monotonic()
        for q in [q for q in self.scheduler.running if q.deadline is not None and now > q.deadline]:
            self.scheduler.finish(q, "timeout", "timeout", f"timeout_ms passed after {len(q.output_ids)} tokens")
            self.complete(q)

    def fail_running(self, message: str) -> None:
        for q in list(self.scheduler.running):
            self.scheduler.finish(q, "error", "error", message)
            self.complete(q)


def _token_times(q: Question, queued_ms: float) -> tuple[float | None, float | None]:
    """Time to first token (submit → first token, queue included) and the mean time between later tokens, in ms."""
    if q.first_token_mono is None or q.started_mono is None:
        return None, None
    ttft = queued_ms + (q.first_token_mono - q.started_mono) * 1000
    gaps = len(q.output_ids) - 1
    tpot = (q.last_token_mono - q.first_token_mono) * 1000 / gaps if gaps > 0 and q.last_token_mono else None
    return round(ttft, 3), (round(tpot, 3) if tpot is not None else None)
