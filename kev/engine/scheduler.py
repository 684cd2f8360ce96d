"""Scheduler: the one place a question changes state, and which channels take part in the next step.

Each step is two calls: `schedule()` plans it (deadlines, admission, the work and the slot copies
the packer needs) and `update(plan, sampled_ids)` applies what the forward sampled (new tokens,
stops, finishes) and returns one QuestionOutput per question that produced something. A finish
frees the question's channel and blocks, drops its grammar state and queues its shadow re-run.

Questions are bound to a channel when they arrive (the router picks it, an idle one when its
group has one) and wait in that channel's queue; each step an idle channel starts its queue
head, in FairShare's order across channels (live before batch lines, tenants by weighted fair
queueing, then priority and arrival), within max_parallel, its group's share of the slots and
the batch class's cap. A batch line bound to an idle channel but not started gives the channel
back when a live question finds none (it computed nothing, so where it runs changes nothing).
Placement stays work-conserving: a question waiting behind a busy channel moves
to a channel of its group that has fallen idle (rerouted: true) instead of waiting beside it.

Decode tokens go first (one per channel), then the prompts this step can finish (within half
the budget: a short question behind long documents gets its first token at once), then prefill
chunks in admission order while the step's token budget lasts. A chunk always ends at a multiple of
prefill_chunk counted from the question's own start, so how a prompt is cut never
depends on what else is running (batch invariance).
"""
from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import count

from kev.results.result import FinishReason
from kev.config.speculative_config import SpeculativeConfig
from kev.engine.channel_pool import ChannelPool, queue_order
from kev.engine.draft_costs import DraftCosts
from kev.engine.drafts import PromptLookup, resolve
from kev.engine.fair_share import FairShare, is_batch
from kev.engine.plan import QuestionOutput, SampleRow, StepPlan, Work
from kev.engine.prefix_jobs import PrefixJob, PrefixJobs
from kev.engine.question import Phase, Question
from kev.engine.stats import EngineLoad
from kev.engine.kv.block_manager import BlockManager
from kev.router.layout import ChannelGroup
from kev.router.router import Router


@dataclass(frozen=True)
class SchedulerLimits:
    max_parallel: int
    max_step_tokens: int
    prefill_chunk: int
    max_context: int
    reserve_per_channel: bool  # unified KV: each channel holds max_context blocks for life
    max_queue: int = 0  # overflow FIFO of policy `queue`: questions no channel could take yet
    speculative: SpeculativeConfig = SpeculativeConfig()  # prompt-lookup drafts: the default and the row budget


class Scheduler:
    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, pool: ChannelPool, prefixes: PrefixJobs,
                 router: Router, eos_ids: Iterable[int] = (), fair: FairShare | None = None) -> None:
        self.limits, self.blocks, self.pool, self.prefixes, self.router = limits, blocks, pool, prefixes, router
        self.fair = fair or FairShare(None, limits.max_parallel, limits.max_queue)
        self.eos_ids = frozenset(eos_ids)
        self.running: list[Question] = []
        self.overflow: list[Question] = []  # (-priority, arrival) order; bound to no channel yet
        self.shadows: list[Question] = []  # isolation re-runs: they run alone, when nothing else waits
        self._arrival = count()
        self._request_parallel: dict[str, int] = {}  # request_id -> its max_parallel cap
        self._ended: list[QuestionOutput] = []  # finished between updates (deadline, alert): the next update has them
        self.drafts = DraftCounts()
        self.draft_costs = DraftCosts()  # measured step times and acceptance: the measured draft policy's evidence
        # The clock of channel time (entering a channel, tokens, deadlines, finishing): a test moves its own
        # instead of waiting for deadlines to pass.
        self.clock: Callable[[], float] = time.monotonic

    # --- requests and arrivals ----------------------------------------------------
    def open_request(self, request_id: str, max_parallel: int) -> None:
        self._request_parallel[request_id] = max_parallel

    def close_request(self, request_id: str) -> None:
        self._request_parallel.pop(request_id, None)

    def add(self, question: Question) -> bool:
        """Bind the question to a channel queue; False when no channel of its group can take it."""
        self._arrive(question)
        if question.shadow_of is not None:
            self.shadows.append(question)
            return True
        if question.features is None:  # built outside submit(): describe it from its text here
            text = question.normalized_text or question.original_text or ""
            question.features = self.router.describe(text, len(question.prompt_ids))
        placement = self.router.route(question.features, self.pool)
        if placement is None:
            return False
        question.rerouted = placement.rerouted
        self.pool.enqueue(placement.channel_id, question)
        return True

    def defer(self, question: Question, bounded: bool = True) -> bool:
        """Hold the question in the overflow FIFO; bounded (policy `queue`): False when max_queue are held.
        Policy `wait` does not bound it: each question there has a caller blocked in submit()."""
        if bounded and (len(self.overflow) >= self.limits.max_queue
                        or not self.fair.queue_room(question.tenant, self.overflow)):
            return False
        self._arrive(question)
        self.overflow.insert(bisect.bisect(self.overflow, queue_order(question), key=queue_order), question)
        return True

    def _arrive(self, question: Question) -> None:
        if question.arrival is None:  # first time here (the overflow FIFO drains through add())
            question.arrival = next(self._arrival)
            if question.prefix_ids:
                self.prefixes.register(question)

    def waiting(self) -> list[Question]:
        """Every question not running yet: in a channel queue or in the overflow FIFO (shadows aside)."""
        return self.pool.queued() + self.overflow

    def load(self) -> EngineLoad:
        blocks, store = self.blocks, self.prefixes.store
        return EngineLoad(len(self.running), len(self.waiting()), blocks.num_used_blocks, blocks.num_blocks,
                          store.num_loose_queries, store.num_loose_hits,
                          {tenant: (queries, hits) for tenant, (queries, hits) in store.loose_counts.items()},
                          self.drafts.drafts, self.drafts.draft_tokens, self.drafts.accepted_tokens)

    def has_work(self) -> bool:
        return bool(self.running or self.overflow or self.pool.num_queued() or self.shadows or self.prefixes.jobs
                    or self._ended)

    # --- one step -----------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Time out what passed its deadline, admit what fits, and plan the step's work."""
        self._expire_deadlines()
        self._admit()
        sampling = [q for q in self.running if q.phase is Phase.DECODE]
        decode = [Work(q, q.num_computed, 1, True) for q in sampling]
        budget = self.limits.max_step_tokens - len(decode)
        prefill: list[Work] = []
        jobs = [job for job in self.prefixes.jobs if not job.is_done]
        waiting = jobs + [q for q in self.running if q.phase is Phase.PREFILL]
        # First the prompts this step can finish (a short question's whole prompt, a document's last chunk), within
        # half the budget, so a short question queued behind long documents gets its first token next step; then
        # the rest in admission order (FIFO: a later long prompt never overtakes an earlier one).
        finishing = [seq for seq in waiting if self._chunk_end(seq) == len(seq.prompt_ids)]
        budget_left = self._plan_prefill(finishing, budget // 2, prefill, bool(decode), stop_at_first=False)
        budget -= budget // 2 - budget_left
        planned = {id(w.seq) for w in prefill}
        self._plan_prefill([seq for seq in waiting if id(seq) not in planned], budget, prefill, bool(decode))
        self._plan_drafts(decode, len(decode) + sum(w.length for w in prefill))
        sampling += [w.seq for w in prefill if w.samples and isinstance(w.seq, Question)]  # in packing order
        work = decode + prefill
        for w in work:
            assert w.seq.channel_id is not None  # running, or a prefix job (its owner)
            self.blocks.ensure(w.seq.channel_id, w.start + w.length)
        # sampling: decode rows first, as packed; what sampling reads of them is snapshotted here, under the lock
        drafts = {id(w.seq): w.draft for w in decode if w.draft}
        return StepPlan(work, self.prefixes.take_copies(), sampling,
                        [SampleRow.of(q, drafts.get(id(q), ())) for q in sampling])

    def _plan_drafts(self, decode: list[Work], rows: int) -> None:
        """Adaptive prompt-lookup drafts: while the step holds fewer than speculative.max_step_rows rows, a decoding
        question that finds its last tokens earlier in its own text gets the tokens that followed as extra rows.
        Past that budget a step is compute-bound and extra rows would cost what they might save; under
        speculative.policy measured, the budget is also what the measured step times say pays (draft_costs.py)."""
        budget = min(self.limits.speculative.max_step_rows, self.limits.max_step_tokens) - rows
        if self.limits.speculative.policy == "measured" and budget > 0:
            budget = self.draft_costs.affordable(rows, budget)
        for w in decode:
            if budget <= 0:
                return
            q = w.question
            lookup = self._lookup(q)
            if lookup is None:
                continue
            # Never past the last position plain decoding computes: its token limit and the context.
            limit = min(budget, q.sampling.token_limit - len(q.output_ids) - 1,
                        self.limits.max_context - q.num_tokens - 1)
            draft = lookup.propose(q.all_ids, limit) if limit > 0 else []
            if draft:
                w.draft, w.length = tuple(draft), 1 + len(draft)
                budget -= len(draft)

    def _lookup(self, q: Question) -> PromptLookup | None:
        """The question's draft index, made on first use; None where it does not draft (off, or a grammar: its
        matcher would have to advance through tokens not yet accepted)."""
        if q.grammar is not None:
            return None
        if q.lookup is None:
            settings = resolve(q.sampling.speculative, self.limits.speculative)
            q.lookup = PromptLookup(settings) if settings is not None else False
        return q.lookup if isinstance(q.lookup, PromptLookup) else None

    def _chunk_end(self, seq: Question | PrefixJob) -> int:
        """Where the prompt's next chunk ends: a multiple of prefill_chunk counted from its own start (after an attached
        prefix), never a length set by what else runs."""
        chunk, origin = self.limits.prefill_chunk, seq.prefix_len
        return min(origin + ((seq.num_computed - origin) // chunk + 1) * chunk, len(seq.prompt_ids))

    def _plan_prefill(self, seqs: list[Question | PrefixJob], budget: int, prefill: list[Work], any_decode: bool,
                      stop_at_first: bool = True) -> int:
        """Appends the next chunk of each seq, in order, while the budget lasts; returns the budget left.
        stop_at_first: the first chunk that does not fit ends the plan (FIFO); otherwise it is skipped."""
        for seq in seqs:
            end = self._chunk_end(seq)
            length = end - seq.num_computed
            if length > budget and (any_decode or prefill):
                if stop_at_first:
                    break
                continue
            if isinstance(seq, Question):
                prefill.append(Work(seq, seq.num_computed, length, end == len(seq.prompt_ids),
                                    seq.sampling.prompt_logprobs))
            else:  # a prefix job never samples
                prefill.append(Work(seq, seq.num_computed, length, False))
            budget -= length
        return budget

    def update(self, plan: StepPlan, sampled_ids: list[list[int]] | None) -> list[QuestionOutput]:
        """Apply the step's forward (None: it did not run, nothing advanced); per question, what it produced: the
        tokens it kept this step (one, or more where a draft was accepted), each its own QuestionOutput."""
        outputs, self._ended = self._ended, []
        if sampled_ids is None:
            return outputs
        drafted = {id(w.seq): w for w in plan.work if w.draft}
        for w in plan.work:
            w.seq.num_computed = w.start + w.length  # a drafted question's: set below, from what it kept
        self.prefixes.finish_done()
        now = self.clock()
        row = 0
        for q, tokens, sample_row in zip(plan.sampling, sampled_ids, plan.sample_rows):
            first_row, row = row, row + 1 + len(sample_row.draft)
            if (verified := drafted.get(id(q))) is not None:
                # Rows start..start + len(tokens) - 1 were computed from the tokens kept: their K/V stand. The
                # rows after them saw a rejected draft token: their K/V are past num_computed, never read
                # (a row reads keys up to its own position) and overwritten when plain decoding reaches them.
                q.num_computed = verified.start + len(tokens)
                self.drafts.count(len(verified.draft), len(tokens) - 1)
                self.draft_costs.record_verify(len(verified.draft), len(tokens) - 1)
                if isinstance(q.lookup, PromptLookup):
                    q.lookup.feedback(len(verified.draft), len(tokens) - 1)
            if q.is_finished:  # cancelled or timed out while the forward ran
                continue
            q.phase = Phase.DECODE
            if q.sampling.token_limit == 0:  # scoring only: the prompt's logprobs are all it wanted
                outputs.append(self.finish(q, "length"))
                continue
            q.first_token_mono = q.first_token_mono or now
            for offset, token in enumerate(tokens):
                q.output_ids.append(token)
                q.last_token_mono = now
                reason, error = self._stop_reason(q, token)
                if reason is not None:
                    self._end(q, reason, error)
                outputs.append(QuestionOutput(q, [token], reason, first_row + offset, len(q.output_ids)))
                if reason is not None:
                    break
            if verified is not None and not q.is_finished and not self.limits.reserve_per_channel:
                assert q.channel_id is not None
                self.blocks.trim(q.channel_id, q.num_tokens)  # blocks taken for rejected rows go back
        return outputs

    def record_step(self, plan: StepPlan, seconds: float) -> None:
        """A step's wall time, kept by row count when every row decoded (a drafted question's rows included): the
        measured draft policy weighs a draft's rows by it."""
        if plan.work and all(isinstance(w.seq, Question) and w.samples and w.length == 1 + len(w.draft)
                             and w.start > 0 for w in plan.work):
            self.draft_costs.record_step(sum(w.length for w in plan.work), seconds)

    def _stop_reason(self, q: Question, token: int) -> tuple[FinishReason | None, str | None]:
        """Stops decided by tokens; stop strings are the output processor's (it has the text)."""
        if q.grammar is not None:
            q.grammar.accept(token)
            if q.grammar.error:  # the caller's constraint led nowhere (the mask then allows only EOS)
                return "error", q.grammar.dead_end(q.request_id, q.index, len(q.output_ids) - 1)
        if token in self.eos_ids and not q.sampling.ignore_eos:
            return "stop", None
        if q.grammar is not None and q.grammar.is_done:  # the constrained text is whole: nothing may follow
            return "stop", None
        if len(q.output_ids) >= q.sampling.token_limit or q.num_tokens >= self.limits.max_context:
            return "length", None
        return None, None

    # --- finishing ----------------------------------------------------------------
    def finish(self, question: Question, reason: FinishReason, error: str | None = None) -> QuestionOutput:
        """Stop a question wherever it is (a no-op when it has finished already)."""
        self._end(question, reason, error)
        return QuestionOutput(question, [], reason)

    def stop_at_string(self, question: Question, num_tokens: int | None = None) -> None:
        """The output processor found a stop string in the text: it ends here, as a stop (not length). num_tokens:
        the answer's length at the token that completed it, when a step added tokens after it (drafts): those go, as
        plain decoding would never have computed them."""
        if num_tokens is not None:
            del question.output_ids[num_tokens:]
        if question.is_finished:
            if question.finish_reason == "length":
                question.finish_reason = "stop"
            return
        self._end(question, "stop")

    def fail_channels(self, channel_ids: list[int], message: str) -> bool:
        """An isolation alert: the questions running in these channels end in error; False if none did."""
        affected = [q for q in self.running if q.channel_id in channel_ids]
        for q in affected:
            self._end(q, "error", message)
            self._ended.append(QuestionOutput(q, [], "error"))
        return bool(affected)

    def fail_running(self, message: str) -> list[QuestionOutput]:
        """A step that raised: every running question ends in error."""
        return [self.finish(q, "error", message) for q in list(self.running)]

    def _expire_deadlines(self) -> None:
        now = self.clock()
        for q in [q for q in self.running if q.deadline is not None and now > q.deadline]:
            self._end(q, "timeout", f"timeout_ms passed after {len(q.output_ids)} tokens")
            self._ended.append(QuestionOutput(q, [], "timeout"))

    def _end(self, question: Question, reason: FinishReason, error: str | None = None) -> None:
        """Frees its channel (and, in split mode, its blocks) and drops its grammar state; an answer to verify
        queues its shadow re-run."""
        if question.is_finished:
            return
        question.phase, question.finish_reason, question.error = Phase.FINISHED, reason, error
        question.finished_at, question.finished_mono = time.time(), self.clock()
        question.grammar = None  # the channel's grammar state goes with the question that held the channel
        if question in self.running:
            self.running.remove(question)
            assert question.channel_id is not None
            if not self.limits.reserve_per_channel:
                self.blocks.release(question.channel_id)
            self.pool.release(question.channel_id)
        else:
            if not self.pool.remove(question):
                for held in (self.overflow, self.shadows):
                    if question in held:
                        held.remove(question)
            self.prefixes.forget(question)
        if question.shadow and question.status == "ok":
            self.add(question.shadow_copy())

    # --- admission ----------------------------------------------------------------
    def _admit(self) -> None:
        if any(q.shadow_of is not None for q in self.running):
            return  # a shadow re-run is alone in the engine
        self._yield_to_live()
        self._drain_overflow()
        if self.shadows and not self.running and not self.waiting():
            self._start_shadow()
            return
        self._move_to_idle()
        per_request = Counter(q.request_id for q in self.running)
        per_group = Counter(self._group(q).name for q in self.running)
        num_batch = sum(is_batch(q) for q in self.running)
        live_waits: bool | None = None  # known once the first batch line comes up (live ones come first)
        for q in self.fair.order(self.pool.ready()):
            if len(self.running) >= self.limits.max_parallel:
                break
            group, cap = self._group(q), self._request_parallel.get(q.request_id, self.limits.max_parallel)
            if per_group[group.name] >= group.slots or per_request[q.request_id] >= cap:
                continue
            if is_batch(q):
                if live_waits is None:
                    live_waits = any(not is_batch(w) for w in self.waiting())
                live_present = live_waits or any(not is_batch(r) for r in self.running)
                if live_waits or num_batch >= self.fair.batch_cap(live_present):
                    continue  # a batch line never takes a slot a live question waits for
            if not self.prefixes.is_ready(q) or not self._fits(q):
                continue
            self._start(q)
            self.fair.started(q)
            per_request[q.request_id] += 1
            per_group[group.name] += 1
            num_batch += is_batch(q)
        self._drain_overflow()  # the queue heads that started left room

    def _move_to_idle(self) -> None:
        """Questions queued behind a busy channel go to idle channels of their group, first in queue order."""
        if not any(self.pool.is_idle(c.channel_id) for c in self.pool.channels):
            return
        for q in sorted(self.pool.queued(), key=queue_order):
            assert q.channel_id is not None and q.features is not None
            channel = self.pool.channels[q.channel_id]
            if channel.question is None and channel.queue[0] is q:
                continue  # it starts where it is
            if any(self.pool.is_idle(c) for c in self._group(q).channels):  # the strategy picks which one
                placement = self.router.route(q.features, self.pool)
                assert placement is not None  # an idle channel of its group can take it
                self.pool.move(q, placement.channel_id)
                q.rerouted = True

    def _start(self, q: Question) -> None:
        self.pool.start(q)
        assert q.channel_id is not None
        if not self.limits.reserve_per_channel:
            self.blocks.promise(q.channel_id, self._max_tokens(q))
        if q.prefix is not None:
            self.prefixes.attach(q)
        q.phase, q.started_at, q.started_mono = Phase.PREFILL, time.time(), self.clock()
        self.running.append(q)

    def _start_shadow(self) -> None:
        """The engine is idle: the oldest shadow re-run takes its original's channel, alone."""
        q = self.shadows[0]
        assert q.shadow_of is not None
        if self.prefixes.is_ready(q) and self._fits(q):
            self.shadows.pop(0)
            self.pool.enqueue(q.shadow_of.channel_id or 0, q)
            self._start(q)

    def _group(self, q: Question) -> ChannelGroup:
        assert q.channel_id is not None
        return self.router.layout.group_of(q.channel_id)

    def _drain_overflow(self) -> None:
        """Route the overflow FIFO into channels with room, in FairShare's order (a full group keeps its place)."""
        if self.overflow:
            kept = {id(q) for q in self.fair.order(self.overflow) if not self.add(q)}
            self.overflow = [q for q in self.overflow if id(q) in kept]

    def _yield_to_live(self) -> None:
        """Live questions in the overflow FIFO (no channel could take them) take back channels that batch lines hold
        without running: those lines go back to the FIFO, in their order. They computed nothing yet, and a question's
        answer never depends on its channel, so this changes when they run, not what they compute."""
        num_live = sum(1 for q in self.overflow if not is_batch(q))
        for channel in self.pool.channels:
            if num_live <= 0:
                return
            if channel.question is None and channel.queue and all(is_batch(q) for q in channel.queue):
                for q in list(channel.queue):
                    self.pool.remove(q)
                    q.channel_id = None
                    self.overflow.insert(bisect.bisect(self.overflow, queue_order(q), key=queue_order), q)
                num_live -= 1

    def _max_tokens(self, q: Question) -> int:
        return min(len(q.prompt_ids) + q.sampling.token_limit, self.limits.max_context)

    def _fits(self, q: Question) -> bool:
        need = self._max_tokens(q)
        if self.limits.reserve_per_channel or self.blocks.can_promise(need):
            return True
        # Idle cached prefixes (loose) give way to live questions.
        return self.prefixes.store.evict(self.blocks.blocks_for(need)) and self.blocks.can_promise(need)


@dataclass
class DraftCounts:
    """Prompt-lookup drafts verified so far (vLLM's spec-decode counters)."""

    drafts: int = 0  # verify steps a question took with a draft
    draft_tokens: int = 0  # tokens drafted
    accepted_tokens: int = 0  # drafted tokens the model itself sampled (each one a step saved)

    def count(self, drafted: int, accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
