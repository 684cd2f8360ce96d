"""Worker: `kev worker`, a full Kev engine fed from the work stream.

It pulls only as many questions as it has free slots (router.max_parallel_queries, the
channels one forward runs): that is the backpressure, the rest stays in the stream where
every worker and router can see it. Partitions no live worker serves come first: a dead
worker's questions come back there when their ack wait runs out, and they are older than
anything new (the router places new work on live partitions only), so serving them first
serves the work by age; then its own partition, then the shared overflow queue.
Every question pulled joins the engine, which packs them into one forward as in single
mode. Heartbeats (in_progress) keep long generations from being redelivered; the ack comes
after the answer is published. Malformed messages go to the dead-letter stream.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from kev.results.result import Result
from kev.config import KevConfig
from kev.distributed.connection import NATS_ERRORS, Link, connect_forever
from kev.distributed.dead_letter import reject
from kev.distributed.directory import WorkerDirectory
from kev.distributed.messages import MalformedMessage, WorkerStatus, WorkItem, decode
from kev.distributed.subjects import answer_key
from kev.distributed.worker_job import Job, groups
from kev.engine.api import EngineAPI
from kev.engine.events import EventRouter
from kev.engine.request import StreamEvent
from kev.engine.sampling_params import SamplingParams
from kev.errors import KevError

log = logging.getLogger("kev.distributed")
LONG_POLL_S = 0.5  # waiting on the own partition; the others are polled in between
GATHER_S = 0.01  # after a fetch, how long to wait for more of what is arriving
ORPHAN_POLL_S = 0.02  # a partition without a live worker, polled before the own one
CANCEL_MEMORY_S = 600.0


class Worker:
    def __init__(self, config: KevConfig, engine: EngineAPI, worker_id: str, partition: int) -> None:
        self.config, self.engine, self.worker_id, self.partition = config, engine, worker_id, partition
        self.capacity = config.router.max_parallel_queries
        self.jobs: dict[str, Job] = {}  # "<request_id>.<index>" -> job
        self.cancelled: dict[str, float] = {}  # request_id -> when heard (time.monotonic())
        self.directory = WorkerDirectory(config.deploy.heartbeat_s)
        self.stopping = asyncio.Event()
        self.link: Link | None = None
        self._room = asyncio.Event()  # set when a job ends
        self._tasks: set[asyncio.Task[Any]] = set()
        self.events = EventRouter()  # the engine's one event stream, routed to each group's jobs
        engine.subscribe(self.events)

    async def run(self, grace_s: float = 30.0) -> None:
        deploy = self.config.deploy
        link = await connect_forever(deploy, f"kev-worker-{self.worker_id}", "worker", self.stopping)
        if link is None:
            return
        self.link, topology = link, link.topology
        await link.nc.subscribe(topology.cancel_subject, cb=self._on_cancel)
        await link.nc.subscribe(topology.status_subject("*"), cb=self._on_status)
        subs = {durable: await link.js.pull_subscribe_bind(durable=durable, stream=topology.work_stream)
                for durable, _ in topology.work_consumers()}
        home, overflow = topology.partition_consumer(self.partition), topology.overflow_consumer
        log.info("worker %s: pulling partition %d (%s) with %d slots", self.worker_id, self.partition, home,
                 self.capacity)
        heartbeat = asyncio.ensure_future(self._heartbeat())
        while not self.stopping.is_set():
            if len(self.jobs) >= self.capacity:
                await self._wait(self._room, LONG_POLL_S)
                self._room.clear()
                continue
            got = 0
            for partition in self._orphans():  # the oldest work first: a dead worker's redelivered questions
                got += await self._pull(subs[topology.partition_consumer(partition)], ORPHAN_POLL_S)
            if not got:
                got = await self._pull(subs[home], LONG_POLL_S)
            if not got:
                await self._pull(subs[overflow], 0.05)
        await self._drain(grace_s)
        heartbeat.cancel()

    async def _pull(self, sub: JetStreamContext.PullSubscription, timeout: float) -> int:
        free = self.capacity - len(self.jobs)
        if free <= 0 or self.link is None or not self.link.is_connected:
            if not self.stopping.is_set():
                await self._wait(self.stopping, timeout)
            return 0
        msgs: list[Msg] = []
        try:
            msgs += await sub.fetch(free, timeout=timeout)
            while len(msgs) < free:  # a request's questions arrive one by one: gather them, so they start together
                msgs += await sub.fetch(free - len(msgs), timeout=GATHER_S)
        except TimeoutError:
            pass
        except NATS_ERRORS as err:  # NATS went away: the connection comes back by itself
            log.debug("worker %s: fetch failed: %s", self.worker_id, err)
            await self._wait(self.stopping, timeout)
            return 0
        jobs = [job for msg in msgs if (job := await self._accept(msg)) is not None]
        for group in groups(jobs):
            self._spawn(self._run_group(group))
        return len(msgs)

    def _orphans(self) -> list[int]:
        """Partitions no live worker pulls (a dead worker's, or more partitions than workers)."""
        live = self.directory.live_partitions() or set()
        return [p for p in range(self.config.deploy.num_partitions) if p != self.partition and p not in live]

    async def _accept(self, msg: Msg) -> Job | None:
        """A job for the message, or None (malformed: dead letter; stale, cancelled or already running here)."""
        assert self.link is not None
        try:
            item = decode(WorkItem, msg.data)
        except MalformedMessage as err:
            await self._guarded(reject(self.link.js, self.link.topology, msg, "work", str(err), self.worker_id))
            return None
        key = answer_key(item.request_id, item.index)
        if key in self.jobs:  # redelivered while still running here (a late heartbeat): keep one run
            self.jobs[key].msg = msg
            return None
        if item.request_id in self.cancelled or (item.expires_at is not None and time.time() > item.expires_at):
            await self._guarded(msg.ack())  # nobody waits for it any more
            return None
        job = self.jobs[key] = Job(item, msg, self.worker_id)
        return job

    async def _run_group(self, jobs: list[Job]) -> None:
        """One engine request for the group, then each job to its ack."""
        try:
            first = jobs[0].item
            engine_request_id = await asyncio.to_thread(self.engine.submit, [j.item.question for j in jobs],
                                                        SamplingParams.from_options(first.sampling), **first.options)
        except KevError as err:  # options the engine refuses: each question's answer is that error
            for job in jobs:
                job.fail(str(err))
        else:
            for engine_index, job in enumerate(jobs):
                job.engine_request_id, job.engine_index = engine_request_id, engine_index
            loop = asyncio.get_running_loop()

            def to_job(event: StreamEvent) -> None:  # on the engine's thread: hand off to the loop
                loop.call_soon_threadsafe(jobs[event.index].events.put_nowait, event)
            self.events.route(engine_request_id, to_job)
        await asyncio.gather(*(self._run_job(job) for job in jobs))
        if jobs[0].engine_request_id is not None:
            self.engine.forget(jobs[0].engine_request_id)
            self.events.drop(jobs[0].engine_request_id)

    async def _run_job(self, job: Job) -> None:
        assert self.link is not None
        key = answer_key(job.item.request_id, job.item.index)
        try:
            result = await self._answer(job)
            await self._publish_answer(job, job.answer(result))
            await self._guarded(job.msg.ack())
        except Exception:  # a bug, not the question's fault: hand it back for another try
            log.exception("worker %s: question %s failed", self.worker_id, key)
            await self._guarded(job.msg.nak())
        finally:
            self.jobs.pop(key, None)
            self._room.set()

    async def _answer(self, job: Job) -> Result:
        """Relay the question's deltas as the engine makes them; its final result."""
        assert self.link is not None
        while (event := await job.events.get()).result is None:
            await self._guarded(self.link.nc.publish(self.link.topology.delta_subject(job.item.request_id),
                                                     job.delta(event).encode()))
        return event.result

    async def _publish_answer(self, job: Job, answer: Any) -> None:
        """Until JetStream has it (NATS may be away for a while); the question is not acked before."""
        assert self.link is not None
        delay = 0.2
        while True:
            try:
                await self.link.js.publish(self.link.topology.result_subject(job.item.request_id), answer.encode())
                return
            except Exception as err:
                log.info("worker %s: publishing an answer failed (%s); retrying", self.worker_id, err)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)

    async def _heartbeat(self) -> None:
        """in_progress for every question held (so none is redelivered mid-answer), and the status beacon."""
        period = min(self.config.deploy.ack_wait_s / 3, self.config.deploy.heartbeat_s)
        while True:
            await asyncio.sleep(period)
            if self.link is None or not self.link.is_connected:
                continue
            for job in list(self.jobs.values()):
                await self._guarded(job.msg.in_progress())
            await self._guarded(self._publish_status())
            horizon = time.monotonic() - CANCEL_MEMORY_S
            self.cancelled = {r: t for r, t in self.cancelled.items() if t > horizon}

    async def _publish_status(self) -> None:
        assert self.link is not None
        channels = await asyncio.to_thread(self.engine.channel_states)
        load = await asyncio.to_thread(self.engine.load)
        items = {(job.engine_request_id, job.engine_index): job.item for job in self.jobs.values()}
        for channel in channels:  # the caller's request and index, not the engine's own (one per question)
            if (item := items.get((channel["request_id"], channel["index"]))) is not None:
                channel["request_id"], channel["index"] = item.request_id, item.index
        status = WorkerStatus(worker=self.worker_id, partition=self.partition, capacity=self.capacity,
                              inflight=len(self.jobs), at=time.time(), host=socket.gethostname(), pid=os.getpid(),
                              channels=channels, queue_length=sum(c["queued"] for c in channels),
                              num_steps=self.engine.stats.num_steps,
                              num_tokens_computed=self.engine.stats.num_tokens_computed,
                              num_tokens_generated=self.engine.stats.num_tokens_generated,
                              alerts=self.engine.alert_counts(), load=load.to_counts())
        await self.link.nc.publish(self.link.topology.status_subject(self.worker_id), status.encode())

    async def _on_status(self, msg: Msg) -> None:
        self.directory.on_status(msg.data)

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            request_id = str(json.loads(msg.data)["request_id"])
        except (ValueError, KeyError, TypeError):
            return
        self.cancelled[request_id] = time.monotonic()
        for engine_request_id in {j.engine_request_id for j in self.jobs.values() if j.item.request_id == request_id}:
            if engine_request_id is not None:
                await asyncio.to_thread(self.engine.cancel, engine_request_id)

    async def _drain(self, grace_s: float) -> None:
        """Stopping: let the questions held finish for grace_s; hand back the rest (nak: redelivered at once)."""
        deadline = time.monotonic() + grace_s
        while self.jobs and time.monotonic() < deadline:
            await self._wait(self._room, 0.2)
            self._room.clear()
        for job in list(self.jobs.values()):
            await self._guarded(job.msg.nak())
        for engine_request_id in {j.engine_request_id for j in self.jobs.values() if j.engine_request_id is not None}:
            await asyncio.to_thread(self.engine.forget, engine_request_id)
        for task in list(self._tasks):
            task.cancel()
        if self.link is not None:  # close, not drain: drain waits out its timeout on pull subscriptions
            await self._guarded(self.link.nc.flush())
            await self._guarded(self.link.nc.close())

    async def _guarded(self, awaitable: Any) -> None:
        try:
            await awaitable
        except NATS_ERRORS as err:
            log.debug("worker %s: %s", self.worker_id, err)

    @staticmethod
    async def _wait(event: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

