"""RouterEngine: `kev serve` in deploy.mode distributed: the HTTP edge and router of a cluster.

It implements EngineAPI (kev/engine/api.py), so the server holds it as it holds an Engine (EngineBridge).
Its NATS side runs on an event loop of its own, in a thread, where all of its state lives; the
EngineAPI calls hand their work to that loop and wait for it (as an Engine's calls take its lock).
submit() checks the request as an engine would, routes each question to a work partition
(kev/router/placement.py), applies overflow_policy against the stream's backlog, writes
the request record (deadlines) to the requests bucket, then publishes one WorkItem per
question and returns. Answers and deltas come back from the aggregator on {p}.out.<router_id>
and go out on the router's one event stream (subscribe). While NATS is unreachable, new work
gets a 503 (UnavailableError; `link.unavailable` says why) and the connection recovers by itself;
answers missed meanwhile are read back from the answers bucket.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from kev.results.result import Result
from kev.config import KevConfig
from kev.distributed.answers import claim, read_answer
from kev.distributed.directory import WorkerDirectory
from kev.distributed.loop_thread import LoopThread
from kev.distributed.messages import (MalformedMessage, OutMessage, QuestionRecord, RequestRecord, WorkItem, decode,
                                      result_from_dict)
from kev.router.placement import PartitionPlacer
from kev.distributed.prepare import Prepared, prepare, validate_options
from kev.distributed.router_encoder import load_router_model
from kev.distributed.router_link import RouterLink
from kev.distributed.router_requests import OpenRequest
from kev.engine.request import EventListener, Request
from kev.engine.request_front import RequestFront
from kev.engine.stats import EngineLoad, EngineStats
from kev.engine.sampling_params import SamplingParams, split_submit
from kev.engine.submission import new_request_id
from kev.errors import InvalidRequestError, OverflowTimeoutError, RejectedError, UnavailableError
from kev.router.router import Placement

log = logging.getLogger("kev.distributed")
T = TypeVar("T")
GRACE_S = 2.0  # a worker's own timeout result gets this long to arrive before the aggregator's placeholder


class RouterEngine(RequestFront[OpenRequest]):
    failure: str | None = None  # the cluster's faults are retried, never final

    def __init__(self, config: KevConfig, registry: CollectorRegistry) -> None:
        """registry: where the cluster's gauges go (the server's /metrics)."""
        self.config = config
        model = load_router_model(config)  # the loader thread: tokenizer + embedding table
        self.tokenizer, self.vocab_size = model.tokenizer, model.vocab_size
        self.placer = PartitionPlacer.build(config.router, config.deploy.num_partitions, model.encoder)
        self.directory = WorkerDirectory(config.deploy.heartbeat_s)
        self.router_id = "r" + uuid.uuid4().hex[:12]
        self.requests: dict[str, OpenRequest] = {}
        self.listeners: list[EventListener] = []
        self.link = RouterLink(config.deploy, self.router_id, self.placer.loads, self.directory, registry,
                               self._on_out, self._reconcile)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.loop = LoopThread("kev-router")  # where all of the above lives
        self.loop.call_soon(self._spawn, self.link.run())

    # --- the Engine API --------------------------------------------------------------
    def submit(self, queries: list[Any], sampling: SamplingParams | None = None, **options: Any) -> str:
        sampling, options = split_submit(sampling, options)
        return self.loop.run(self._submit(queries, sampling, options))

    def cancel(self, request_id: str) -> None:
        """Unfinished questions get a cancelled answer (partial text kept); the workers are told to stop."""
        self.loop.run(self._cancel(request_id))

    def cancel_unfinished(self) -> int:
        return self.loop.run(self._cancel_unfinished())

    def forget(self, request_id: str) -> None:
        """Cancel what is left and drop the request; its cancelled answers are out when this returns."""
        if not self.loop.is_stopped:
            self.loop.run(self._forget(request_id))

    def subscribe(self, listener: EventListener) -> None:
        self.listeners.append(listener)

    def channel_states(self) -> list[dict[str, Any]]:
        """Every live worker's channels (from their heartbeats)."""
        return self.loop.call(self.directory.channel_states)

    def queue_length(self) -> int:
        return self.loop.call(lambda: self.placer.loads.total_waiting)

    def load(self) -> EngineLoad:
        """The workers' loads from their heartbeats; questions still in the work stream count as waiting."""
        return self.loop.call(self._load)

    @property
    def stats(self) -> EngineStats:
        """The live workers' step counters (their steps are in their own audit logs, not here)."""
        return self.loop.call(lambda: self.directory.totals()[0])

    def alert_counts(self) -> dict[str, int]:
        return self.loop.call(lambda: self.directory.totals()[1])

    def describe(self) -> dict[str, Any]:
        deploy = self.config.deploy
        return {"mode": "distributed router", "router": self.router_id,
                "nats": re.sub(r"//[^@/,]*@", "//", deploy.nats_url or ""),  # never a password
                "partitions": deploy.num_partitions, "max_parallel_per_worker": self.config.router.max_parallel_queries}

    def close(self) -> None:
        """Close the link to NATS and stop the loop (unfinished requests: cancel_unfinished first)."""
        if not self.loop.is_stopped:
            self.loop.run(self._close())
            self.loop.stop()

    # --- submit --------------------------------------------------------------------
    async def _submit(self, queries: list[Any], sampling: SamplingParams, options: dict[str, Any]) -> str:
        if (why := self.link.unavailable) is not None:
            raise UnavailableError(why)
        submit = validate_options(self.config, sampling, options)
        if not isinstance(queries, (list, tuple)) or not queries:
            raise InvalidRequestError("queries: must be a non-empty list")
        request_id = new_request_id()
        prepared, errors = prepare(list(queries), request_id, submit, self.config, self.tokenizer, self.vocab_size,
                                   self.placer.router)
        placements = await self._place(prepared)
        request = OpenRequest(request_id, len(queries), self.config.aggregator.mode, submit.isolation,
                              {p.index for p in prepared}, {p.index: p.priority for p in prepared},
                              {p.index: p.original_text for p in prepared}, self.listeners)
        self.requests[request_id] = request  # before publishing: an answer may come back at once
        try:
            await self._publish(request, sampling, options, prepared, placements)
        except Exception as err:
            self.placer.unplace([p.channel_id if p else None for p in placements])
            del self.requests[request_id]
            self._spawn(self.link.withdraw(request_id))
            raise UnavailableError(f"NATS did not take the questions ({type(err).__name__}: {err}); retry") from None
        for result in errors:
            self._accept(request, result, -1)
        return request_id

    async def _place(self, prepared: list[Prepared]) -> list[Placement | None]:
        placements: list[Placement | None] = []
        try:
            for p in prepared:
                placements.append(await self._place_one(p))
        except BaseException:
            self.placer.unplace([p.channel_id if p else None for p in placements])
            raise
        return placements

    async def _place_one(self, p: Prepared) -> Placement | None:
        """A partition, or None for the overflow queue; raises as Engine.submit's overflow does."""
        policy = self.config.router.overflow_policy
        deadline = None if p.timeout_ms is None else time.monotonic() + p.timeout_ms / 1000
        while (placement := self.placer.place(p.features)) is None:
            if policy == "queue":
                if self.placer.defer():
                    return None
                raise RejectedError(f"overflow queue full (router.max_queue={self.placer.max_queue}); "
                                    f"{self._backlog()}")
            if policy == "reject":
                raise RejectedError(f"no worker partition can take question {p.index} (overflow_policy=reject); "
                                    f"{self._backlog()}")
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise OverflowTimeoutError(f"no worker partition could take question {p.index} within its timeout_ms "
                                           f"({p.timeout_ms}, overflow_policy=wait); {self._backlog()}")
            await self.link.next_poll(min(remaining, 1.0))
        return placement

    def _backlog(self) -> str:
        loads = self.placer.loads
        return (f"{len(loads.waiting)} partitions: waiting {loads.waiting} (room {loads.room} each = "
                f"router.channel_pool_size x max(1, router.channel_queue_depth)), pulled {loads.running}, "
                f"{loads.overflow} in the overflow queue")

    async def _publish(self, request: OpenRequest, sampling: SamplingParams, options: dict[str, Any],
                       prepared: list[Prepared],
                       placements: list[Placement | None]) -> None:
        if not prepared:
            return
        now, deploy, topology, request_id = time.time(), self.config.deploy, self.link.topology, request.request_id
        strategy = self.placer.router.strategy_name
        expires = {p.index: None if p.timeout_ms is None
                   else now + (deploy.queue_timeout_ms + p.timeout_ms) / 1000 + GRACE_S for p in prepared}
        record = RequestRecord(request_id=request_id, reply=self.router_id, num_questions=request.num_questions,
                               isolation=request.isolation, strategy=strategy, questions=[
                                   QuestionRecord(index=p.index, expires_at=expires[p.index],
                                                  original_text=p.original_text, hash_bucket=p.features.bucket,
                                                  category=p.features.category)
                                   for p in prepared])
        await self.link.put_record(request_id, record)
        items = [(topology.partition_subject(pl.channel_id) if pl else topology.overflow_subject,
                  WorkItem(request_id=request_id, index=p.index, question=p.question, sampling=sampling.to_json(),
                           options=options,
                           reply=self.router_id, strategy=strategy, rerouted=bool(pl and pl.rerouted),
                           submitted_at=now, expires_at=expires[p.index]))
                 for p, pl in zip(prepared, placements)]
        await asyncio.gather(*(self._publish_one(subject, item, pl) for (subject, item), pl in zip(items, placements)))

    async def _publish_one(self, subject: str, item: WorkItem, placement: Placement | None) -> None:
        await self.link.publish_work(subject, item)
        self.placer.loads.published(placement.channel_id if placement else None)

    # --- answers -------------------------------------------------------------------
    async def _on_out(self, msg: Msg) -> None:
        try:
            out = decode(OutMessage, msg.data)
        except MalformedMessage as err:
            log.warning("router %s: dropped a message from the aggregator: %s", self.router_id, err)
            return
        if out.kind == "answer" and out.answer is not None:
            request = self.requests.get(str(out.answer.result.get("request_id")))
            if request is not None:
                self._accept(request, result_from_dict(out.answer.result), out.answer.seq)
        elif out.kind == "delta" and out.delta is not None and (request := self.requests.get(out.delta.request_id)):
            request.add_delta(out.delta)

    def _accept(self, request: OpenRequest, result: Result, seq: int) -> None:
        if request.add_result(result, seq) and request.is_done and request.published:
            self._spawn(self.link.drop_record(request.request_id))

    async def _reconcile(self, min_age_s: float) -> None:
        """Read back answers this router missed (it was disconnected when they were relayed)."""
        now, answers = time.monotonic(), self.link.answers
        if answers is None:  # not connected yet: nothing to read back
            return
        for request in [r for r in self.requests.values() if not r.is_done and now - r.created >= min_age_s]:
            for index in request.missing():
                found = await read_answer(answers, request.request_id, index)
                if found is not None:
                    self._accept(request, found[1], found[0])

    # --- on the loop ----------------------------------------------------------------
    async def _cancel(self, request_id: str) -> None:
        request = self._request(request_id)
        missing = request.missing()
        if not missing:
            return
        await self.link.broadcast_cancel(request_id)
        for index in missing:
            text, ids, channel = request.partial_answer(index)
            result = Result(request_id, index, text=text, token_ids=ids, completion_tokens=len(ids), channel_id=channel,
                            finished_at=time.time(), finish_reason="cancelled", status="cancelled",
                            isolation=request.isolation, strategy=self.placer.router.strategy_name,
                            original_text=request.originals.get(index))
            seq, winner = await claim(self.link.answers if self.link.is_connected else None, result)
            self._accept(request, winner, seq)

    async def _forget(self, request_id: str) -> None:
        if request_id not in self.requests:
            return
        await self._cancel(request_id)
        self.requests.pop(request_id, None)
        await self.link.drop_record(request_id)

    async def _cancel_unfinished(self) -> int:
        unfinished = [rid for rid, r in self.requests.items() if not r.is_done]
        for request_id in unfinished:
            try:
                await asyncio.wait_for(self._cancel(request_id), 5)
            except Exception as err:
                log.warning("shutdown: cancelling %s: %s", request_id, err)
        return len(unfinished)

    def _load(self) -> EngineLoad:
        load = self.directory.load()
        return replace(load, num_waiting=load.num_waiting + self.placer.loads.total_waiting)

    async def _close(self) -> None:
        await self.link.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- how RequestFront reads its requests -------------------------------------------
    def _ordered(self, request: OpenRequest) -> list[Result]:
        return request.ordered()

    def _view(self, request: OpenRequest) -> Request:
        return request.view

    def _home(self, read: Callable[[], T]) -> T:
        """Requests live on the loop: read them there."""
        return self.loop.call(read)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("router %s: background task failed: %r", self.router_id, task.exception())
