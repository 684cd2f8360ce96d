"""RouterLink: the router's NATS side: connect (and keep trying), listen, poll the backlog, publish.

Every POLL_S it reads the work consumers' counts (waiting, pulled) into the placement's
loads and the live partitions from the worker heartbeats, and whether an aggregator is
pulling answers (its consumer has waiting pull requests): with none for AGGREGATOR_GRACE_S
the router is not ready (answers would wait in the stream; requests would stall). After a reconnect, and every
RECONCILE_S, it asks the backend to read back answers it may have missed.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry

from kev.config.deploy_config import DeployConfig
from kev.distributed.connection import NATS_ERRORS, Link, connect_forever, topology_of
from kev.distributed.directory import WorkerDirectory
from kev.distributed.messages import RequestRecord, WorkItem
from kev.router.placement import PartitionLoads
from kev.distributed.router_metrics import add_cluster_gauges

log = logging.getLogger("kev.distributed")
POLL_S = 0.25
RECONCILE_S = 5.0
AGGREGATOR_GRACE_S = 3.0  # an aggregator's pull requests lapse between fetches; longer than that, none is there


class RouterLink:
    def __init__(self, deploy: DeployConfig, router_id: str, loads: PartitionLoads, directory: WorkerDirectory,
                 registry: CollectorRegistry, on_out: Callable[[Msg], Awaitable[None]],
                 reconcile: Callable[[float], Awaitable[None]]) -> None:
        self.deploy, self.router_id, self.loads, self.directory = deploy, router_id, loads, directory
        self.topology = topology_of(deploy)
        add_cluster_gauges(registry, loads, directory.num_live, lambda: self.is_connected)
        self._on_out, self._reconcile = on_out, reconcile
        self.link: Link | None = None
        self._stopping = asyncio.Event()
        self._polled = asyncio.Event()  # replaced after each poll; `wait` submitters sleep on it
        self._reconcile_at = 0.0
        self._aggregator_seen = time.monotonic()  # when an aggregator last had a pull request waiting

    @property
    def is_connected(self) -> bool:
        return self.link is not None and self.link.is_connected

    @property
    def unavailable(self) -> str | None:
        if self.link is None:
            return f"not connected to NATS ({self.deploy.nats_url}) yet"
        if not self.link.is_connected:
            return f"NATS ({self.deploy.nats_url}) is unreachable; new work is refused until it is back"
        return None

    @property
    def degraded(self) -> str | None:
        """Not ready though connected: no aggregator pulls answers (kev aggregator down?)."""
        if self.is_connected and time.monotonic() - self._aggregator_seen > AGGREGATOR_GRACE_S:
            return (f"no aggregator has pulled answers from {self.topology.results_stream} for "
                    f"{time.monotonic() - self._aggregator_seen:.0f} s (is `kev aggregator` running?)")
        return None

    @property
    def notice(self) -> str | None:
        """Ready, but short of workers: fewer heard from lately than deploy.workers (one died or is restarting)."""
        live = self.directory.live_names()  # read from the server's thread: changes nothing
        if len(live) >= self.deploy.workers:
            return None
        gone = sorted(set(list(self.directory.seen)) - live)
        return (f"{len(live)} of deploy.workers={self.deploy.workers} workers live"
                + (f"; not heard from lately: {', '.join(gone)}" if gone else ""))

    @property
    def answers(self) -> KeyValue | None:
        return self.link.answers if self.link is not None else None

    async def run(self) -> None:
        link = await connect_forever(self.deploy, f"kev-router-{self.router_id}", "router", self._stopping,
                                     on_reconnect=self._after_reconnect)
        if link is None:
            return
        await link.nc.subscribe(self.topology.out_subject(self.router_id), cb=self._on_out)
        await link.nc.subscribe(self.topology.status_subject("*"), cb=self._on_status)
        self.link = link
        self._aggregator_seen = time.monotonic()
        log.info("router %s: connected to NATS at %s", self.router_id, self.deploy.nats_url)
        while not self._stopping.is_set():
            if link.is_connected:
                await self._poll(link)
                if time.monotonic() >= self._reconcile_at:
                    self._reconcile_at = time.monotonic() + RECONCILE_S
                    await self._guarded(self._reconcile(1.0))
            try:
                await asyncio.wait_for(self._stopping.wait(), POLL_S)
            except TimeoutError:
                pass

    async def _on_status(self, msg: Msg) -> None:
        self.directory.on_status(msg.data)

    async def _after_reconnect(self) -> None:
        self._reconcile_at = 0.0  # answers relayed while we were away are in the bucket

    async def _poll(self, link: Link) -> None:
        consumers = self.topology.work_consumers()
        since = self.loads.snapshot()
        try:
            infos = await asyncio.gather(*(link.js.consumer_info(self.topology.work_stream, durable)
                                           for durable, _ in consumers))
            aggregator = await link.js.consumer_info(self.topology.results_stream, self.topology.aggregator_consumer)
        except NATS_ERRORS as err:  # NATS went away mid-poll: keep the last counts
            log.debug("router %s: backlog poll failed: %s", self.router_id, err)
            return
        if aggregator.num_waiting:
            self._aggregator_seen = time.monotonic()
        self.loads.update([i.num_pending or 0 for i in infos[:-1]], [i.num_ack_pending or 0 for i in infos[:-1]],
                          infos[-1].num_pending or 0, since)
        self.loads.live = self.directory.live_partitions()
        polled, self._polled = self._polled, asyncio.Event()
        polled.set()

    async def next_poll(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._polled.wait(), timeout)
        except TimeoutError:
            pass

    # --- what the backend sends ------------------------------------------------------
    async def put_record(self, request_id: str, record: RequestRecord) -> None:
        assert self.link is not None
        await self.link.requests.put(request_id, record.encode())

    async def publish_work(self, subject: str, item: WorkItem) -> None:
        assert self.link is not None
        # The message id makes a repeated publish (a retry) a no-op within the stream's duplicate window.
        await self.link.js.publish(subject, item.encode(), headers={"Nats-Msg-Id": f"{item.request_id}.{item.index}"})

    async def broadcast_cancel(self, request_id: str) -> None:
        if self.link is not None and self.link.is_connected:
            await self._guarded(self.link.nc.publish(self.topology.cancel_subject,
                                                     json.dumps({"request_id": request_id}).encode()))

    async def drop_record(self, request_id: str) -> None:
        """The request is over: the aggregator stops watching its deadlines."""
        if self.link is not None and self.link.is_connected:
            await self._guarded(self.link.requests.delete(request_id))

    async def withdraw(self, request_id: str) -> None:
        """A request that failed half-way through publishing: whatever got out is cancelled."""
        await self.broadcast_cancel(request_id)
        await self.drop_record(request_id)

    async def close(self) -> None:
        self._stopping.set()
        if self.link is not None:
            try:
                await asyncio.wait_for(self.link.nc.flush(), 2)
            except NATS_ERRORS as err:
                log.debug("router %s: final flush: %s", self.router_id, err)
            await self.link.nc.close()

    async def _guarded(self, awaitable: Awaitable[object]) -> None:
        try:
            await awaitable
        except Exception as err:
            log.warning("router %s: %s", self.router_id, err)
