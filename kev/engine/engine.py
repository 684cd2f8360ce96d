"""Engine: the public API (submit / wait / stream / cancel) around one background step loop.

The loop is schedule → pack → forward → sample → postprocess. Everything a user
calls only touches the scheduler under the lock; the forward runs outside it, so
new questions join between steps (continuous batching).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import torch

from kev.aggregator.ordering import order_results
from kev.aggregator.result import Result
from kev.config import ConfigSource, KevConfig, load_config
from kev.engine.engine_setup import EngineParts, build_parts
from kev.engine.inputs import QuestionError, RequestDefaults
from kev.engine.packer import pack
from kev.engine.postprocess import Postprocessor
from kev.engine.request import Request, StreamEvent
from kev.engine.sampler import sample
from kev.engine.stats import EngineStats
from kev.engine.submission import SubmitOptions, build_questions
from kev.errors import InvalidRequestError, UnknownRequestError

log = logging.getLogger("kev.engine")


class Engine:
    def __init__(self, config: KevConfig, parts: EngineParts | None = None, record_logits: bool = False) -> None:
        self.config = config
        self.parts = parts or build_parts(config)
        self.tokenizer, self.runner, self.scheduler = self.parts.tokenizer, self.parts.runner, self.parts.scheduler
        self.record_logits = record_logits
        self.requests: dict[str, Request] = {}
        self.post = Postprocessor(self.parts, self.requests, record_logits)
        self._lock = threading.Condition()
        self._closed = False
        self.stats = EngineStats()
        self._thread = threading.Thread(target=self._loop, name="kev-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, source: ConfigSource = None, **kwargs: Any) -> Engine:
        return cls(load_config(source), **kwargs)

    # --- public API ----------------------------------------------------------
    def submit(self, queries: list[Any], isolation: str | None = None, max_parallel: int | None = None,
               max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
               top_k: int | None = None, seed: int | None = None, stop: list[str] | str | None = None,
               timeout_ms: int | None = None, system: str | None = None) -> str:
        """Queue the questions; returns a request_id at once. Bad questions become error results."""
        options = SubmitOptions.validate(self.config, isolation, max_parallel, max_tokens, temperature,
                                         top_p, top_k, seed, stop, timeout_ms, system)
        if not isinstance(queries, (list, tuple)) or not queries:
            raise InvalidRequestError("queries: must be a non-empty list")
        request_id = uuid.uuid4().hex[:16]
        request = Request(request_id, len(queries), options.isolation)
        questions, errors = build_questions(queries, request_id, options, self.tokenizer, self.config)
        with self._lock:
            if self._closed:
                raise InvalidRequestError("engine is closed")
            self.requests[request_id] = request
            self.scheduler.request_parallel[request_id] = options.max_parallel
            for result in errors:
                self.post.complete_error(request, result)
            for q in questions:
                request.questions[q.index] = q
                self.scheduler.add(q)
            self._lock.notify_all()
        return request_id

    def wait(self, request_id: str, timeout: float | None = None) -> list[Result]:
        """Block until every question of the request has a result; ordered by aggregator.mode."""
        request = self._request(request_id)
        if not request.done.wait(timeout):
            raise TimeoutError(f"request {request_id}: {len(request.results)}/{request.num_questions} results after {timeout}s")
        return self.results(request_id)

    def results(self, request_id: str) -> list[Result]:
        """The results available now (all of them once the request is done)."""
        request = self._request(request_id)
        priorities = {i: q.priority for i, q in request.questions.items()}
        return order_results(list(request.results.values()), self.config.aggregator.mode, priorities)

    def stream(self, request_id: str, timeout: float | None = None) -> Iterator[StreamEvent]:
        """Per-question deltas as they are produced; ends after every question's final event."""
        request = self._request(request_id)
        finished = 0
        while finished < request.num_questions:
            event = request.events.get(timeout=timeout)
            finished += event.finished
            yield event

    def cancel(self, request_id: str) -> None:
        request = self._request(request_id)
        with self._lock:
            for q in request.questions.values():
                if not q.is_finished:
                    self.scheduler.finish(q, "cancelled", "cancelled")
                    self.post.complete(q)

    def forget(self, request_id: str) -> None:
        """Cancel what is unfinished and drop the request's bookkeeping (a long-running server calls this)."""
        with self._lock:  # re-entrant: cancel() takes it too
            self.cancel(request_id)
            self.requests.pop(request_id, None)
            self.scheduler.request_parallel.pop(request_id, None)

    def generate(self, queries: list[Any], timeout: float | None = None, **options: Any) -> list[Result]:
        """submit() then wait(): the one-call form."""
        return self.wait(self.submit(queries, **options), timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop ------------------------------------------------------------
    def step(self) -> int:
        """One forward over every active channel; returns the number of tokens computed."""
        started = time.perf_counter()
        with self._lock:
            self.post.expire_deadlines()
            work = self.scheduler.schedule()
        if not work:
            return 0
        meta = pack(work, self.parts.blocks, self.runner.model.tile, self.runner.device)
        logits = self.runner.run(meta)
        sampling = [w.question for w in work if w.samples]
        tokens = sample(logits, sampling)
        with self._lock:
            self.post.apply(work, sampling, tokens, logits)
        self.stats.record(len(work), meta.num_tokens, len(tokens), (time.perf_counter() - started) * 1000)
        return meta.num_tokens

    @property
    def num_steps(self) -> int:
        return self.stats.num_steps

    def channel_states(self) -> list[dict[str, Any]]:
        """Live state of every channel in the pool: idle / prefill / decode, and whose question it holds."""
        with self._lock:
            states = []
            for channel in self.parts.pool.channels:
                q = channel.question
                states.append({
                    "channel_id": channel.channel_id,
                    "state": q.phase.value if q else "idle",
                    "request_id": q.request_id if q else None,
                    "index": q.index if q else None,
                    "tokens": q.num_tokens if q else 0,
                    "kv_blocks": len(self.parts.blocks.block_table(channel.channel_id)),
                    "num_served": channel.num_served,
                })
            return states

    def queue_length(self) -> int:
        with self._lock:
            return len(self.scheduler.waiting)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self.scheduler.has_work():
                    self._lock.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as err:  # a broken step fails its questions, never the engine
                log.exception("step failed")
                with self._lock:
                    self.post.fail_running(f"engine step failed: {err!r}")

    def _request(self, request_id: str) -> Request:
        request = self.requests.get(request_id)
        if request is None:
            raise UnknownRequestError(f"request_id {request_id!r} is unknown")
        return request
