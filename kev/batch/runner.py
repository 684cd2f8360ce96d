"""BatchRunner: a job's requests through the backend (an engine, replicas or a cluster), at most max_inflight at once.

Nothing blocks on one request: each line is a task that submits, waits for its answer and
hands the output line to `emit` (completion order, or input order with `ordered`, holding back
what is early). Channels never idle for want of work while max_inflight covers them. A full
pool or an unreachable queue is waited out, never a failed line. When `stop` is set, nothing
new is submitted, what is running is cancelled, and nothing unfinished is written: a later
run of the same job does it. Lines sharing a long prompt start go as one engine request (line_groups.py), so
the engine computes that start once; each still gets its own record.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kev.engine.sampling_params import SamplingParams
from kev.results.result import Result
from kev.batch.line_groups import Positioned, group_lines, merged_queries, split_results
from kev.batch.records import answer_record, response_record
from kev.batch.requests import BatchRequest
from kev.errors import InvalidRequestError, RejectedError, UnavailableError
from kev.backend.bridge import EngineBridge
from kev.wire.bodies.errors import ApiError, error_body

log = logging.getLogger("kev.batch")
Emit = Callable[[BatchRequest, dict[str, Any]], None]
RETRY_S = (0.05, 0.2, 1.0)  # backoff while the pool is full or the queue unreachable


class BatchRunner:
    def __init__(self, backend: EngineBridge, model_name: str, max_inflight: int, ordered: bool = False,
                 tenant: str | None = None, work_class: str | None = None) -> None:
        """tenant: whose requests these are (a server batch's owner, `kev batch --tenant`); None: the default.
        work_class: "batch" for a server's batches (they wait behind live requests); None: live (a local job)."""
        self.backend, self.model_name = backend, model_name
        self.max_inflight, self.ordered, self.tenant, self.work_class = max_inflight, ordered, tenant, work_class

    async def run(self, requests: list[BatchRequest], emit: Emit, stop: asyncio.Event) -> bool:
        """True when every request was answered; False when stopped first."""
        slots = asyncio.Semaphore(self.max_inflight)
        order = _InputOrder(emit) if self.ordered else None
        tasks: list[asyncio.Task[None]] = []
        started = 0
        for group in group_lines(requests):
            if not await _acquire(slots, stop):
                break
            tasks.append(asyncio.create_task(self._one(group, slots, stop, order.emit if order else
                                                       (lambda _, r, rec: emit(r, rec)))))
            started += len(group)
        await asyncio.gather(*tasks)
        return not stop.is_set() and started == len(requests)

    async def _one(self, group: list[Positioned], slots: asyncio.Semaphore, stop: asyncio.Event,
                   emit: Callable[[int, BatchRequest, dict[str, Any]], None]) -> None:
        try:
            records = await self._answer(group, stop)
        except Exception as err:  # a backend fault fails these lines, never the job
            log.exception("batch line %d failed", group[0][1].line.line_no)
            records = [response_record(r.custom_id, 500, error_body(500, f"internal error: {err!r}", None), None)
                       for _, r in group]
        finally:
            slots.release()
        if records is not None and not stop.is_set():
            for (position, request), record in zip(group, records):
                emit(position, request, record)

    async def _answer(self, group: list[Positioned], stop: asyncio.Event) -> list[dict[str, Any]] | None:
        """One record per line of the group (one engine request for them all), or None when stopped first."""
        queries = merged_queries(group)
        try:
            request_id = await self._submit(queries, group[0][1].call.sampling, group[0][1].call.options, stop)
        except InvalidRequestError as err:  # refused outright (e.g. an isolation level over the cap), as the route
            return [response_record(r.custom_id, 422, ApiError.from_message(422, str(err)).body(), None)
                    for _, r in group]
        if request_id is None:
            return None
        try:
            watch = self.backend.watch(request_id, len(queries), listen=False)
            if not await _first(watch.done.wait(), stop):
                return None
            results: list[Result] = await self.backend.results(request_id)
        finally:
            self.backend.forget(request_id)
        if any(r.status == "cancelled" for r in results):  # cancelled under us (shutdown): not an answer
            return None
        if len(group) == 1:
            return [answer_record(group[0][1], request_id, results, self.model_name, self.backend.tokenizer)]
        return [answer_record(request, f"{request_id}-{k}", line_results, self.model_name, self.backend.tokenizer)
                for k, ((_, request), line_results) in enumerate(zip(group, split_results(group, results)))]

    async def _submit(self, queries: list[Any], sampling: SamplingParams, options: dict[str, Any],
                      stop: asyncio.Event) -> str | None:
        """The request_id, or None when stopped first; InvalidRequestError passes through."""
        attempt = 0
        options = options if self.tenant is None else {**options, "tenant": self.tenant}
        options = options if self.work_class is None else {**options, "work_class": self.work_class}
        while not stop.is_set():
            try:
                return await self.backend.submit(queries, sampling, options)
            except (RejectedError, UnavailableError, TimeoutError) as err:  # full, or unreachable: wait it out
                log.debug("%d questions: %s; retrying", len(queries), err)
            await _first(asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)]), stop)
            attempt += 1
        return None


class _InputOrder:
    """--ordered: lines go out in input order; one that finishes early waits for those before it."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._next = 0
        self._held: dict[int, tuple[BatchRequest, dict[str, Any]]] = {}

    def emit(self, position: int, request: BatchRequest, record: dict[str, Any]) -> None:
        self._held[position] = (request, record)
        while self._next in self._held:
            self._emit(*self._held.pop(self._next))
            self._next += 1


async def _acquire(slots: asyncio.Semaphore, stop: asyncio.Event) -> bool:
    if stop.is_set():
        return False
    acquired = await _first(slots.acquire(), stop)
    if not acquired:
        return False
    if stop.is_set():
        slots.release()
        return False
    return True


async def _first(awaitable: Any, stop: asyncio.Event) -> bool:
    """Await `awaitable` unless `stop` is set first; True when it finished."""
    task = asyncio.ensure_future(awaitable)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return False
