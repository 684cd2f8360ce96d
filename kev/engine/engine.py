"""Engine: the public API (submit / wait / stream / cancel) around one background step loop.

The loop is schedule → pack → forward → sample → update → emit. Everything a user
calls only touches the scheduler under the lock; the forward runs outside it, so
new questions join between steps (continuous batching). The scheduler is the only
place a question changes state; the output processor turns what each step produced
into text, events and Results.
"""
from __future__ import annotations

import atexit
import gc
import logging
import queue
import threading
import time
import weakref
from typing import Any

import torch

from kev.results.ordering import order_results
from kev.results.result import Result
from kev.config import ConfigSource, KevConfig, load_config
from kev.engine.bind_waiters import BindWaiters
from kev.engine.channel_view import channel_states
from kev.engine.describe import describe
from kev.engine.engine_setup import EngineParts, build_parts
from kev.engine.isolation_guard import IsolationGuard
from kev.engine.logprobs import LogitRows
from kev.engine.output import OutputProcessor, OutputSettings
from kev.engine.overflow import place_all
from kev.engine.packer import pack
from kev.engine.question import Question
from kev.engine.request import EventListener, Request
from kev.engine.request_front import RequestFront
from kev.engine.sampler import sample
from kev.engine.plan import StepPlan
from kev.engine.stats import EngineLoad, EngineStats
from kev.engine.structured import GrammarCompiler
from kev.engine.sampling_params import SamplingParams, sampling_of
from kev.engine.submission import SubmitOptions, build_questions, new_request_id
from kev.errors import (EngineFailedError, InvalidRequestError, OverflowTimeoutError, RejectedError, UnavailableError)
from kev.engine.kv.audit import AuditLog
from kev.model.device import pick_device
from kev.model.step_metadata import StepMetadata

log = logging.getLogger("kev.engine")

# Engines whose loop thread still runs. A script that never closes its engine would otherwise exit with the loop
# thread (a daemon, owner of the OpenMP pool) still inside torch while the interpreter tears down, which can abort
# the process ("terminate called without an active exception"); atexit runs before daemon threads are stopped.
_running: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_running_engines() -> None:
    for engine in list(_running):
        engine.close()


class Engine(RequestFront[Request]):
    def __init__(self, config: KevConfig, parts: EngineParts | None = None, record_logits: bool = False,
                 background: bool = True) -> None:
        """background=False: no loop thread; wait() and run_until_idle() drive step() in the caller."""
        self.config = config
        self._failure: str | None = None  # why a step failed for good (see `failure`)
        self._closed = True  # until setup has finished: a loop thread that sees it set ends
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        if background:
            # The loop thread loads the model itself when it has to: then it owns the process's only
            # OpenMP pool, and its GEMMs run ~20% faster than beside a pool of the caller's
            # (docs/design.md, Known limits).
            handoff: queue.Queue[EngineParts | BaseException] = queue.Queue(maxsize=1)
            self._thread = threading.Thread(target=self._loop, args=(parts, handoff), name="kev-engine", daemon=True)
            self._thread.start()
            built = handoff.get()
            if isinstance(built, BaseException):
                raise built
            parts = built
        try:
            self._setup(config, parts or build_parts(config), record_logits)
        finally:
            self._started.set()
        if self._thread is not None:
            _running.add(self)

    def _setup(self, config: KevConfig, parts: EngineParts, record_logits: bool) -> None:
        self.parts = parts
        self.tokenizer, self.runner, self.scheduler = self.parts.tokenizer, self.parts.runner, self.parts.scheduler
        self.record_logits = record_logits
        self.requests: dict[str, Request] = {}
        self.audit = AuditLog(config.audit.path, config.audit.level)
        self.parts.blocks.on_change = self.audit.on_blocks
        eos_ids = self.scheduler.eos_ids
        settings = OutputSettings(eos_ids, config.core.max_context, self.runner.fingerprint, parts.router.strategy_name,
                                  record_logits)
        self.output = OutputProcessor(self.tokenizer, settings, self.requests, self.audit,
                                      self.scheduler.stop_at_string)
        self.grammars = GrammarCompiler(self.tokenizer, self.runner.model.config.vocab_size, sorted(eos_ids))
        self.guard = IsolationGuard(self.audit, self.parts.blocks, self.scheduler.fail_channels)
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self.bind_waiters = BindWaiters(self._mutex)  # submit()s blocked by overflow_policy `wait`
        self.stats = EngineStats()
        # The model's, tokenizer's and grammar compiler's objects live as long as the engine: moved out of the
        # collector's reach (as vLLM does after start-up), a full collection mid-batch no longer walks them
        # (a 0.2 s pause inside a 160-question batch on the default model, Zen 4).
        gc.freeze()
        self._closed = False

    @classmethod
    def from_config(cls, source: ConfigSource = None, **kwargs: Any) -> Engine:
        return cls(load_config(source), **kwargs)

    # --- public API ----------------------------------------------------------
    def submit(self, queries: list[Any], sampling: SamplingParams | None = None, *, isolation: str | None = None,
               max_parallel: int | None = None, timeout_ms: int | None = None, system: str | None = None,
               tenant: str | None = None, work_class: str | None = None, **sampling_options: Any) -> str:
        """Route the questions to channels; returns a request_id. Bad questions become error results.

        sampling: how every question samples (kev.engine.sampling_params.SamplingParams; a question given as a
        dict may override any of its fields). As a convenience its fields may be given as keywords instead
        (`submit(qs, max_tokens=8)`), never both. logprobs=k: each new token's logprob and its k most likely
        alternatives; prompt_logprobs: every prompt token's too (then max_tokens may be 0: score only), both of
        the model's distribution before temperature, top-k/top-p and any grammar. tenant: whose request (the
        server's API key names it; default "default"): under loose, a prefix other than the operator's public
        one is reused only by requests of the same tenant. work_class: live (default) or batch (a server batch's
        lines): batch waits behind live work and holds at most its share of the slots (sharing.*).

        When no channel can take a question, router.overflow_policy decides: `wait` blocks
        here (OverflowTimeoutError after the question's timeout_ms), `queue` and `reject`
        return at once or raise RejectedError."""
        sampling = sampling_of(sampling, sampling_options)
        options = SubmitOptions.validate(self.config, isolation, max_parallel, timeout_ms, system, sampling, tenant,
                                         work_class)
        if not isinstance(queries, (list, tuple)) or not queries:
            raise InvalidRequestError("queries: must be a non-empty list")
        request_id = new_request_id()
        request = Request(request_id, len(queries), options.isolation)
        questions, errors = build_questions(queries, request_id, options, self.tokenizer, self.config,
                                            self.runner.model.config.vocab_size, self.parts.router, self.grammars,
                                            self.runner.chunk_invariant)
        with self._lock:
            if (failure := self.failure) is not None:
                raise UnavailableError(failure)
            if self._closed:
                raise InvalidRequestError("engine is closed")
            self.requests[request_id] = request
            self.scheduler.open_request(request_id, options.max_parallel)
            request.questions.update((q.index, q) for q in questions)
            try:
                place_all(self.scheduler, questions, self.config.router.overflow_policy, self._wait_for_room)
            except (RejectedError, OverflowTimeoutError):
                del self.requests[request_id]
                self.scheduler.close_request(request_id)
                raise
            finally:
                self._lock.notify_all()
            for refused in errors:  # only an accepted request has results
                # A prompt over the context is the caller's mistake, counted as a reject (kev_rejects_total), not
                # an isolation alert: alerts are what the audit itself finds.
                self.output.reject(request, refused.result)
        return request_id

    def wait(self, request_id: str, timeout: float | None = None) -> list[Result]:
        """Block until every question of the request has a result; ordered by aggregator.mode."""
        self._request(request_id)
        if self._thread is None:
            self.run_until_idle()
        return super().wait(request_id, timeout)

    def _ordered(self, request: Request) -> list[Result]:
        priorities = {i: q.priority for i, q in request.questions.items()}
        return order_results(list(request.results.values()), self.config.aggregator.mode, priorities)

    def cancel(self, request_id: str) -> None:
        request = self._request(request_id)
        with self._lock:
            unfinished = [q for q in request.questions.values() if not q.is_finished]
            self.output.process([self.scheduler.finish(q, "cancelled") for q in unfinished])
            self.bind_waiters.wake_bound()  # a submit() still blocked on these questions returns

    def forget(self, request_id: str) -> None:
        """Cancel what is unfinished and drop the request's bookkeeping (a long-running server calls this)."""
        with self._lock:  # re-entrant: cancel() takes it too
            self.cancel(request_id)
            self.requests.pop(request_id, None)
            self.scheduler.close_request(request_id)

    def cancel_unfinished(self) -> int:
        """Cancel every request not done yet; returns how many."""
        with self._lock:
            unfinished = [rid for rid, request in self.requests.items() if not request.done.is_set()]
            for request_id in unfinished:
                self.cancel(request_id)
            return len(unfinished)

    def alert_counts(self) -> dict[str, int]:
        """Audit alerts raised so far, by kind."""
        return dict(self.audit.alert_counts)

    def close(self) -> None:
        """Stop the loop; unfinished questions end as cancelled, so every wait() and stream() returns."""
        with self._lock:
            self._closed = True
            self.cancel_unfinished()
            self._lock.notify_all()
        _running.discard(self)
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.runner.close()
        gc.unfreeze()  # frozen objects are never collected: a closed engine's cycles must be collectable again

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop ------------------------------------------------------------
    def step(self) -> int:
        """One forward over every active channel; returns the number of tokens computed."""
        started = time.perf_counter()
        with self._lock:
            plan = self.scheduler.schedule()
            self.bind_waiters.wake_bound()  # submit()s whose questions this plan admitted return
            self.runner.copy_slots(plan.copies)  # shared-prefix K/V into the channels that attach it
            meta = self._pack(plan)  # None: nothing to run, or the audit stopped the forward
        logits = LogitRows.split(plan.work, self.runner.run(meta)) if meta is not None else None
        sampled_ids = sample(logits.sampling, plan.sample_rows) if logits is not None else None
        with self._lock:
            if sampled_ids is not None:
                self.scheduler.record_step(plan, time.perf_counter() - started)
            self.output.process(self.scheduler.update(plan, sampled_ids), logits)
            self._lock.notify_all()
        return self._record(plan, meta, sampled_ids, started)

    def _pack(self, plan: StepPlan) -> StepMetadata | None:
        """Lock held: the plan's work packed into one step's metadata, audited (None: no forward this step)."""
        if not plan.work:
            return None
        meta = pack(plan.work, self.parts.blocks, self.runner.tiling, self.runner.device)
        return meta if self.guard.check(meta) else None

    def _record(self, plan: StepPlan, meta: StepMetadata | None, sampled_ids: list[list[int]] | None,
                started: float) -> int:
        if meta is None or sampled_ids is None:
            return 0
        step_ms = (time.perf_counter() - started) * 1000
        self.stats.record(len(plan.work), meta.num_tokens, sum(map(len, sampled_ids)), step_ms,
                          plan.num_prefix_tokens)
        return meta.num_tokens

    def subscribe(self, listener: EventListener) -> None:
        """listener(event) gets every event of every request (deltas and finals), in order, as they are made.
        It is called with the engine lock held, on the thread that made the event: it must hand off, not block."""
        with self._lock:
            self.output.listeners.append(listener)

    def unsubscribe(self, listener: EventListener) -> None:
        with self._lock:
            self.output.listeners.remove(listener)

    @property
    def is_background(self) -> bool:
        """True when a loop thread drives the steps; False when the caller does (wait(), run_until_idle())."""
        return self._thread is not None

    @property
    def num_steps(self) -> int:
        return self.stats.num_steps

    @property
    def failure(self) -> str | None:
        """Why the engine can never compute again (a tensor-parallel rank died, seen by a step or while idle)."""
        return self._failure or self.runner.failure

    def channel_states(self) -> list[dict[str, Any]]:
        """Live state of every channel in the pool: idle / prefill / decode, and whose question it holds."""
        with self._lock:
            return channel_states(self.parts.pool, self.parts.blocks)

    def queue_length(self) -> int:
        with self._lock:
            return len(self.scheduler.waiting())

    def describe(self) -> dict[str, Any]:
        """Model, architecture, precision, device, threads, pool and KV sizes (the start-up banner)."""
        info = describe(self.config, self.runner.model.config, self.parts.blocks.num_blocks,
                        str(pick_device(self.config.core.device)), torch.get_num_threads())
        return {**info, "numerics": self.runner.fingerprint}

    def load(self) -> EngineLoad:
        """Questions running and waiting, KV blocks in use, loose prefix-cache lookups (for /metrics and logs)."""
        with self._lock:
            return self.scheduler.load()

    def has_work(self) -> bool:
        """Questions running, waiting or finished but not yet reported (background=False: step() until not)."""
        with self._lock:
            return self.scheduler.has_work()

    def run_until_idle(self) -> None:
        while self.scheduler.has_work():
            try:
                self.step()
            except EngineFailedError as err:
                self._fail(err)
                raise
        with self._lock:
            self.guard.check_idle()

    def _fail(self, err: EngineFailedError) -> None:
        """The engine cannot compute any more: every unfinished question ends in error and no new one is taken."""
        log.error("engine failed: %s", err)
        with self._lock:
            self._failure, self._closed = str(err), True
            unfinished = [q for r in self.requests.values() for q in r.questions.values() if not q.is_finished]
            self.output.process([self.scheduler.finish(q, "error", self._failure) for q in unfinished])
            self.bind_waiters.wake_bound()
            self._lock.notify_all()

    def _wait_for_room(self, questions: list[Question], seconds: float | None) -> None:
        """overflow_policy `wait`, lock held: let the step loop bind the waiting questions to channels."""
        if self._thread is None:
            self.step()  # no loop thread: the blocked caller drives the engine itself
            return
        self._lock.notify_all()  # the loop may be asleep: what was placed so far is work for it
        self.bind_waiters.wait(questions, seconds)

    def _loop(self, parts: EngineParts | None, handoff: queue.Queue[EngineParts | BaseException]) -> None:
        try:
            handoff.put(parts or build_parts(self.config))
        except BaseException as err:  # a bad model path: the constructor raises it
            handoff.put(err)
            return
        self._started.wait()
        if self._closed:  # the constructor failed after the model loaded
            return
        while True:
            with self._lock:
                if not self._closed and not self.scheduler.has_work():
                    self.guard.check_idle()  # once each time the loop goes idle
                while not self._closed and not self.scheduler.has_work():
                    self._lock.wait()
                if self._closed:
                    return
            try:
                self.step()
            except EngineFailedError as err:  # this one does fail the engine
                self._fail(err)
                return
            except Exception as err:  # a broken step fails its questions, never the engine
                log.exception("step failed")
                with self._lock:
                    self.output.process(self.scheduler.fail_running(f"engine step failed: {err!r}"))
