"""Job: one question a worker pulled, from its engine request to the ack.

The questions of one request pulled together run as one engine request (submit() places
them all before the next step, so they share its forwards, as in single mode). The worker's one
subscription to the engine's event stream hands each event to its job's asyncio queue; the job's task
publishes the deltas in order, then the final answer to the results stream (JetStream, acked
by the server), and only then acks the question. A worker that dies before that ack loses
nothing: the question is redelivered, and the aggregator keeps the first answer.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import nats.errors
from nats.aio.msg import Msg

from kev.results.result import Result, question_field
from kev.distributed.messages import DeltaMessage, ResultMessage, WorkItem
from kev.engine.request import StreamEvent


@dataclass
class Job:
    item: WorkItem
    msg: Msg  # the latest delivery of the question: the one heartbeats and the ack go to
    worker: str
    engine_request_id: str | None = None
    engine_index: int = 0  # its place in that engine request (a group of questions is one engine request)
    events: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    chars: int = 0  # sent so far in this attempt (the deltas' offsets)
    tokens: int = 0

    @property
    def attempt(self) -> int:
        try:
            return self.msg.metadata.num_delivered or 1
        except nats.errors.NotJSMessageError:  # a plain NATS message (no JetStream metadata): its first delivery
            return 1

    def fail(self, message: str) -> None:
        """The engine refused the question's options: that error is its answer."""
        now = time.time()
        error = Result(self.item.request_id, self.item.index, status="error", finish_reason="error", error=message,
                       error_field=question_field(message), started_at=now, finished_at=now)
        self.events.put_nowait(StreamEvent(0, None, "", [], True, error))

    def delta(self, event: StreamEvent) -> DeltaMessage:
        delta = DeltaMessage(request_id=self.item.request_id, index=self.item.index, reply=self.item.reply,
                             worker=self.worker, attempt=self.attempt, channel_id=event.channel_id,
                             text_offset=self.chars, token_offset=self.tokens, text=event.text,
                             token_ids=event.token_ids)
        self.chars += len(event.text)
        self.tokens += len(event.token_ids)
        return delta

    def answer(self, result: Result) -> ResultMessage:
        """The engine's result as the cluster's: the caller's request_id and index, this worker, the router's
        routing."""
        item = self.item
        if result.error_field is not None:  # the engine named the question by its place in this worker's group
            at = f"queries[{item.index}]"
            result.error = (result.error or "").replace(result.error_field.split("]", 1)[0] + "]", at, 1)
            result.error_field = at + result.error_field.split("]", 1)[1]
        result.request_id, result.index, result.worker = item.request_id, item.index, self.worker
        result.strategy, result.rerouted = item.strategy or result.strategy, item.rerouted or result.rerouted
        started = result.started_at or result.finished_at
        if started is not None:  # waits count from the router's submit (the work stream included)
            queue_ms = round(max(0.0, started - item.submitted_at) * 1000, 3)
            if result.ttft_ms is not None:
                result.ttft_ms = round(result.ttft_ms + queue_ms - result.queue_ms, 3)
            result.queue_ms = queue_ms
        return ResultMessage(reply=item.reply, worker=self.worker, attempt=self.attempt, result=result.to_dict())


def groups(jobs: list[Job]) -> list[list[Job]]:
    """Jobs of the same request (and so the same options), each group one engine request."""
    by_key: dict[tuple[str, str], list[Job]] = {}
    for job in jobs:
        options = json.dumps([job.item.sampling, job.item.options], sort_keys=True)
        by_key.setdefault((job.item.request_id, options), []).append(job)
    return list(by_key.values())
