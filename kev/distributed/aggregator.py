"""Aggregator: `kev aggregator`, between the workers' answers and the routers.

- Answers: a durable pull consumer on the results stream. Each answer is claimed in the
  answers bucket (first create wins: a redelivered question's second answer is a duplicate),
  the winner is relayed to the router that asked, and only then is the message acked. A
  restarted aggregator resumes where its consumer was: nothing published meanwhile is lost.
- Order: an answer's revision in the bucket is its acceptance order (seq_append); slot_map
  and priority are orders of the request's indexes, applied by the router as results are read.
- Deadlines: the requests bucket holds every open request's deadlines (the router writes it;
  a KV watch replays it after a restart). A question unanswered at its deadline gets a
  placeholder (status timeout, the streamed text kept), claimed like any answer.
- Streaming: deltas (core NATS) are relayed to the router with replays cut (relay.py).
- A message that does not parse goes to the dead-letter stream with the reason.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from nats.aio.msg import Msg

from kev.results.result import Result
from kev.config import KevConfig
from kev.distributed.answers import claim
from kev.distributed.connection import NATS_ERRORS, Link, connect_forever
from kev.distributed.dead_letter import reject
from kev.distributed.messages import (AnswerMessage, DeltaMessage, MalformedMessage, OutMessage, RequestRecord,
                                      ResultMessage, decode)
from kev.distributed.relay import StreamPosition

log = logging.getLogger("kev.distributed")
Key = tuple[str, int]  # (request_id, index)
TICK_S = 0.2
FORGET_S = 600.0  # how long an answered question is remembered (to drop its late deltas)


class Aggregator:
    def __init__(self, config: KevConfig, aggregator_id: str) -> None:
        self.config, self.aggregator_id = config, aggregator_id
        self.open: dict[str, RequestRecord] = {}  # request_id -> record (from the requests bucket)
        self.answered: dict[Key, float] = {}  # -> time.monotonic() it was answered
        self.positions: dict[Key, StreamPosition] = {}
        self.partial: dict[Key, tuple[str, list[int], int | None, str]] = {}  # text, ids, channel, worker
        self.caught_up = False  # the results consumer had nothing pending at the last fetch
        self.num_answers = self.num_duplicates = self.num_placeholders = 0
        self.stopping = asyncio.Event()
        self.link: Link | None = None
        self._rewatch = asyncio.Event()

    async def run(self) -> None:
        link = await connect_forever(self.config.deploy, f"kev-aggregator-{self.aggregator_id}", "aggregator",
                                     self.stopping, on_reconnect=self._on_reconnect)
        if link is None:
            return
        self.link, topology = link, link.topology
        await link.nc.subscribe(topology.delta_subject("*"), cb=self._on_delta)
        answers = await link.js.pull_subscribe_bind(durable=topology.aggregator_consumer,
                                                    stream=topology.results_stream)
        tasks = [asyncio.ensure_future(self._watch_requests()), asyncio.ensure_future(self._deadlines())]
        log.info("aggregator %s: consuming %s", self.aggregator_id, topology.results_stream)
        while not self.stopping.is_set():
            try:
                msgs = await answers.fetch(64, timeout=0.5)
            except TimeoutError:
                self.caught_up = True
                continue
            except NATS_ERRORS as err:  # NATS away: it comes back by itself
                log.debug("aggregator %s: fetch failed: %s", self.aggregator_id, err)
                self.caught_up = False
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                await self._on_answer(msg)
            self.caught_up = self.caught_up or len(msgs) < 64  # a short batch: nothing else was pending
        for task in tasks:
            task.cancel()
        log.info("aggregator %s: stopping", self.aggregator_id)
        await self._guarded(link.nc.flush())
        await link.nc.close()

    # --- answers -----------------------------------------------------------------
    async def _on_answer(self, msg: Msg) -> None:
        assert self.link is not None
        try:
            message = decode(ResultMessage, msg.data)
            result = message.to_result()
        except (MalformedMessage, TypeError, ValueError) as err:
            await self._guarded(reject(self.link.js, self.link.topology, msg, "result", str(err), self.aggregator_id))
            return
        try:
            seq, winner = await claim(self.link.answers, result)
            await self._relay_answer(message.reply, seq, winner)
        except Exception as err:  # NATS away mid-way: not acked, so it comes back
            log.info("aggregator %s: answer %s.%d not settled (%s); it will be redelivered",
                     self.aggregator_id, result.request_id, result.index, err)
            await self._guarded(msg.nak(delay=1.0))
            return
        self.num_answers += 1
        self.num_duplicates += winner is not result
        self._settle((result.request_id, result.index))
        await self._guarded(msg.ack())

    async def _relay_answer(self, reply: str, seq: int, result: Result) -> None:
        assert self.link is not None
        out = OutMessage(kind="answer", answer=AnswerMessage(seq=max(seq, 0), result=result.to_dict()))
        await self.link.nc.publish(self.link.topology.out_subject(reply), out.encode())

    def _settle(self, key: Key) -> None:
        self.answered[key] = time.monotonic()
        self.positions.pop(key, None)
        self.partial.pop(key, None)

    # --- deltas ------------------------------------------------------------------
    async def _on_delta(self, msg: Msg) -> None:
        assert self.link is not None
        try:
            delta = decode(DeltaMessage, msg.data)
        except MalformedMessage as err:
            await self._guarded(reject(self.link.js, self.link.topology, msg, "delta", str(err), self.aggregator_id))
            return
        key = (delta.request_id, delta.index)
        if key in self.answered:
            return
        position = self.positions.setdefault(key, StreamPosition())
        chars, tokens = position.chars, position.tokens
        new = position.extend(delta.text_offset, delta.text, delta.token_offset, delta.token_ids)
        if new is None:
            return
        text, ids, _, _ = self.partial.get(key, ("", [], None, ""))
        self.partial[key] = (text + new[0], ids + new[1], delta.channel_id, delta.worker)
        relayed = delta.model_copy(update={"text_offset": chars, "token_offset": tokens, "text": new[0],
                                           "token_ids": new[1]})
        await self._guarded(self.link.nc.publish(self.link.topology.out_subject(delta.reply),
                                                 OutMessage(kind="delta", delta=relayed).encode()))

    # --- deadlines ---------------------------------------------------------------
    async def _deadlines(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if not self.caught_up or self.link is None or not self.link.is_connected:
                continue  # an answer may still be waiting in the stream: never time out ahead of it
            now = time.time()
            for record in list(self.open.values()):
                for question in record.questions:
                    key = (record.request_id, question.index)
                    expires = question.expires_at
                    if key not in self.answered and expires is not None and expires <= now:
                        await self._guarded(self._time_out(record, question.index))
            horizon = time.monotonic() - FORGET_S
            self.answered = {k: t for k, t in self.answered.items() if t > horizon}

    async def _time_out(self, record: RequestRecord, index: int) -> None:
        assert self.link is not None
        question = next(q for q in record.questions if q.index == index)
        text, ids, channel, worker = self.partial.get((record.request_id, index), ("", [], None, ""))
        placeholder = Result(record.request_id, index, text=text, token_ids=ids, completion_tokens=len(ids),
                             channel_id=channel, worker=worker or None, finished_at=time.time(),
                             finish_reason="timeout", status="timeout",
                             error="no answer before its deadline (deploy.queue_timeout_ms + timeout_ms)",
                             isolation=record.isolation, strategy=record.strategy, hash_bucket=question.hash_bucket,
                             category=question.category, original_text=question.original_text)
        seq, winner = await claim(self.link.answers, placeholder)
        await self._relay_answer(record.reply, seq, winner)
        self.num_placeholders += winner is placeholder
        self._settle((record.request_id, index))

    # --- the requests bucket -------------------------------------------------------
    async def _watch_requests(self) -> None:
        """Follow the requests bucket; after a reconnect, watch again from the start (it replays every open request)."""
        while True:
            assert self.link is not None
            try:
                watcher = await self.link.requests.watchall()
            except NATS_ERRORS as err:
                log.debug("aggregator %s: watch failed: %s", self.aggregator_id, err)
                await asyncio.sleep(0.5)
                continue
            self._rewatch.clear()
            follow = asyncio.ensure_future(self._follow(watcher))
            await self._rewatch.wait()
            follow.cancel()
            await self._guarded(watcher.stop())

    async def _follow(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:  # the initial values are all in
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.open.pop(entry.key, None)
                continue
            try:
                self.open[entry.key] = decode(RequestRecord, entry.value)
            except MalformedMessage as err:
                log.warning("aggregator %s: request record %s: %s", self.aggregator_id, entry.key, err)

    async def _on_reconnect(self) -> None:
        self._rewatch.set()

    async def _guarded(self, awaitable: Any) -> None:
        try:
            await awaitable
        except NATS_ERRORS as err:
            log.debug("aggregator %s: %s", self.aggregator_id, err)
