"""Connecting to NATS (credentials, TLS, retries) and declaring the streams, consumers and buckets.

The router declares the whole topology on connect (idempotent: several routers may); workers and
the aggregator look up the consumers and buckets they use, and wait until a router has declared
them, so the roles can start in any order and only the router needs the JetStream API's create
calls (kev/distributed/bus_auth.py). A connection reconnects forever once it is up; the first
connect is retried by connect_forever() until it succeeds or the role stops.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue

from kev.config.deploy_config import DeployConfig
from kev.distributed.bus_auth import inbox_prefix
from kev.distributed.messages import use_cluster_secret
from kev.distributed.subjects import Topology
from kev.errors import KevError

log = logging.getLogger("kev.distributed")
# What a call to NATS raises when NATS is away or slow (it comes back by itself): caught where a retry follows.
# Anything else is a bug and propagates.
NATS_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, OSError, asyncio.TimeoutError)
Callback = Callable[[], Awaitable[None]]
Role = Literal["router", "worker", "aggregator"]


class NotDeclared(KevError):
    """The streams, consumers or buckets a worker or aggregator uses are not there yet: a router declares them."""


def topology_of(deploy: DeployConfig) -> Topology:
    return Topology(deploy.subject_prefix, deploy.num_partitions)


def tls_context(deploy: DeployConfig) -> ssl.SSLContext | None:
    tls = deploy.nats_tls
    uses_tls = any(u.strip().startswith(("tls://", "wss://")) for u in (deploy.nats_url or "").split(","))
    if tls is None and not uses_tls:
        return None
    context = ssl.create_default_context(cafile=tls.ca_file if tls else None)
    if tls is not None and tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def connect_options(deploy: DeployConfig, name: str, role: Role) -> dict[str, Any]:
    """nats.connect() keyword arguments: servers, credentials, TLS, reconnect forever, the role's own inboxes."""
    options: dict[str, Any] = {
        "servers": [u.strip() for u in (deploy.nats_url or "").split(",")], "name": name,
        "inbox_prefix": inbox_prefix(role, deploy.subject_prefix),
        "allow_reconnect": True, "max_reconnect_attempts": -1, "reconnect_time_wait": 0.25, "connect_timeout": 2,
        "ping_interval": 5, "max_outstanding_pings": 2,
    }
    if deploy.nats_user is not None:
        options |= {"user": deploy.nats_user, "password": deploy.nats_password}
    if deploy.nats_token is not None:
        options["token"] = deploy.nats_token
    if deploy.nats_creds_file is not None:
        options["user_credentials"] = deploy.nats_creds_file
    context = tls_context(deploy)
    if context is not None:
        options["tls"] = context
        if deploy.nats_tls is not None and deploy.nats_tls.hostname:
            options["tls_hostname"] = deploy.nats_tls.hostname
    return options


@dataclass
class Link:
    """One role's connection: the client, its JetStream context and the two KV buckets (a worker's has none)."""

    nc: Client
    js: JetStreamContext
    topology: Topology
    buckets: tuple[KeyValue, KeyValue] | None  # requests, answers

    @property
    def is_connected(self) -> bool:
        return self.nc.is_connected

    @property
    def requests(self) -> KeyValue:
        return self._bucket(0)

    @property
    def answers(self) -> KeyValue:
        return self._bucket(1)

    def _bucket(self, which: int) -> KeyValue:
        if self.buckets is None:
            raise KevError("a worker's link has no KV buckets (it never reads or writes them)")
        return self.buckets[which]


async def connect(deploy: DeployConfig, name: str, role: Role, on_disconnect: Callback | None = None,
                  on_reconnect: Callback | None = None) -> Link:
    """One attempt: connect, declare the topology (the router) or find it (the others). Raises if NATS is
    unreachable, NotDeclared if no router has declared the topology yet."""
    use_cluster_secret(deploy.cluster_secret)  # this process's messages are tagged, and checked, from here on

    async def quiet(err: Exception) -> None:  # nats-py prints a traceback per failed reconnect otherwise
        log.debug("nats (%s): %s", name, err)

    async def disconnected() -> None:
        if nc.is_closed:  # our own close()
            return
        log.warning("%s: lost the NATS connection; reconnecting", name)
        if on_disconnect is not None:
            await on_disconnect()

    async def reconnected() -> None:
        log.warning("%s: NATS connection is back", name)
        if on_reconnect is not None:
            await on_reconnect()

    nc = await nats.connect(**connect_options(deploy, name, role), error_cb=quiet, disconnected_cb=disconnected,
                            reconnected_cb=reconnected)
    try:
        topology = topology_of(deploy)
        js = nc.jetstream(timeout=5)
        if role == "router":
            buckets: tuple[KeyValue, KeyValue] | None = await declare(js, topology, deploy)
        else:
            buckets = await find(js, topology, role)
    except NotFoundError as err:
        await nc.close()
        raise NotDeclared(f"{err.description or err}: not declared yet (a router declares the cluster's streams, "
                          "consumers and buckets when it connects)") from err
    except BaseException:
        await nc.close()
        raise
    return Link(nc, js, topology, buckets)


def warn_untagged(deploy: DeployConfig, name: str) -> None:
    """Once, as a role starts: without deploy.cluster_secret its messages go untagged and untagged ones are read."""
    if deploy.cluster_secret is None:
        log.warning("%s: no deploy.cluster_secret: messages between roles are not authenticated (no tags); only the "
                    "NATS users and permissions stand between this cluster and a forged work item or answer", name)


async def connect_forever(deploy: DeployConfig, name: str, role: Role, stopping: asyncio.Event,
                          **callbacks: Callback) -> Link | None:
    """connect() until it works (None if `stopping` is set first)."""
    warn_untagged(deploy, name)
    delay = 0.2
    while not stopping.is_set():
        try:
            return await connect(deploy, name, role, **callbacks)
        except NotDeclared as err:
            log.info("%s: %s; waiting", name, err)
        except Exception as err:  # unreachable, refused, not JetStream yet: all mean "try again"
            log.info("%s: NATS at %s not reachable (%s: %s); retrying", name, deploy.nats_url, type(err).__name__, err)
        try:
            await asyncio.wait_for(stopping.wait(), delay)
        except TimeoutError:
            delay = min(delay * 2, 2.0)
    return None


async def find(js: JetStreamContext, topology: Topology, role: Role) -> tuple[KeyValue, KeyValue] | None:
    """A worker's or aggregator's part of the topology, as a router declared it (NotFoundError if not yet): a
    worker pulls the work consumers and uses no bucket; the aggregator pulls its results consumer and uses both."""
    if role == "worker":
        for durable, _ in topology.work_consumers():
            await js.consumer_info(topology.work_stream, durable)
        return None
    await js.consumer_info(topology.results_stream, topology.aggregator_consumer)
    return await js.key_value(topology.requests_bucket), await js.key_value(topology.answers_bucket)


async def declare(js: JetStreamContext, topology: Topology, deploy: DeployConfig) -> tuple[KeyValue, KeyValue]:
    """Create (or keep) the streams, the durable consumers and the KV buckets of the cluster."""
    ttl, copies, file = deploy.result_ttl_s, deploy.stream_replicas, api.StorageType.FILE
    await _stream(js, api.StreamConfig(name=topology.work_stream, subjects=[f"{topology.prefix}.work.>"],
                                       retention=api.RetentionPolicy.WORK_QUEUE, storage=file, num_replicas=copies,
                                       duplicate_window=120.0))
    await _stream(js, api.StreamConfig(name=topology.results_stream, subjects=[f"{topology.prefix}.result.>"],
                                       retention=api.RetentionPolicy.LIMITS, storage=file, num_replicas=copies,
                                       max_age=ttl))
    await _stream(js, api.StreamConfig(name=topology.dead_stream, subjects=[f"{topology.prefix}.dead.>"],
                                       storage=file, num_replicas=copies, max_age=7 * 86400.0))
    for durable, subject in topology.work_consumers():
        await _consumer(js, topology.work_stream, api.ConsumerConfig(
            durable_name=durable, filter_subject=subject, ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=deploy.ack_wait_s, max_deliver=deploy.max_deliver, max_ack_pending=-1))
    await _consumer(js, topology.results_stream, api.ConsumerConfig(
        durable_name=topology.aggregator_consumer, filter_subject=f"{topology.prefix}.result.>",
        ack_policy=api.AckPolicy.EXPLICIT, ack_wait=max(deploy.ack_wait_s, 10.0), max_ack_pending=-1))
    return (await _bucket(js, topology.requests_bucket, ttl, copies),
            await _bucket(js, topology.answers_bucket, ttl, copies))


async def _bucket(js: JetStreamContext, name: str, ttl: float, copies: int) -> KeyValue:
    try:
        return await js.create_key_value(bucket=name, history=1, ttl=ttl, replicas=copies)
    except BadRequestError:
        log.warning("KV bucket %s exists with different settings; using it as it is", name)
        return await js.key_value(name)


async def _stream(js: JetStreamContext, config: api.StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError:  # exists with other settings (an older Kev, another TTL): keep it, say so
        log.warning("stream %s exists with different settings; using it as it is", config.name)


async def _consumer(js: JetStreamContext, stream: str, config: api.ConsumerConfig) -> None:
    try:
        await js.add_consumer(stream, config)
    except BadRequestError:
        log.warning("consumer %s of %s exists with different settings; using it as it is", config.durable_name, stream)
