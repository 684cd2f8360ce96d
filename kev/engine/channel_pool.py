"""ChannelPool: channel_pool_size pre-created channels, reused like database connections.

A channel runs at most one question at a time; the questions the router bound to it
wait in its own queue, live before batch, highest priority first, then in arrival order. An idle channel
(nothing running, nothing queued) always takes a question; a busy one only while fewer
than queue_depth wait in its queue (router.channel_queue_depth; 0, the default: never).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from kev.engine.question import Question


def queue_order(q: Question) -> tuple[int, int, int]:
    """Live before batch lines (docs/security.md, "Sharing"), then priority, then arrival."""
    return (q.work_class == "batch", -q.priority, q.arrival or 0)


@dataclass
class ChannelState:
    channel_id: int
    question: Question | None = None  # the question running in it
    queue: list[Question] = field(default_factory=list)  # bound to it, not yet running
    num_served: int = 0


class ChannelPool:
    def __init__(self, size: int, queue_depth: int) -> None:
        self.channels = [ChannelState(i) for i in range(size)]
        self.queue_depth = queue_depth

    @property
    def size(self) -> int:
        return len(self.channels)

    # --- PoolView (what the router reads) --------------------------------------
    def load(self, channel_id: int) -> int:
        channel = self.channels[channel_id]
        return (channel.question is not None) + len(channel.queue)

    def queue_length(self, channel_id: int) -> int:
        return len(self.channels[channel_id].queue)

    def can_take(self, channel_id: int) -> bool:
        return self.is_idle(channel_id) or len(self.channels[channel_id].queue) < self.queue_depth

    def is_idle(self, channel_id: int) -> bool:
        channel = self.channels[channel_id]
        return channel.question is None and not channel.queue

    # --- queries ---------------------------------------------------------------
    def is_free(self, channel_id: int) -> bool:
        return self.channels[channel_id].question is None

    def num_queued(self) -> int:
        return sum(len(c.queue) for c in self.channels)

    def queued(self) -> list[Question]:
        return [q for c in self.channels for q in c.queue]

    def ready(self) -> list[Question]:
        """The head of every idle channel's queue: the questions that could start this step."""
        return [c.queue[0] for c in self.channels if c.question is None and c.queue]

    # --- changes ---------------------------------------------------------------
    def enqueue(self, channel_id: int, question: Question) -> None:
        question.channel_id = channel_id
        queue = self.channels[channel_id].queue
        queue.insert(bisect.bisect(queue, queue_order(question), key=queue_order), question)

    def remove(self, question: Question) -> bool:
        """Take a waiting question out of its channel's queue; False if it was not queued."""
        if question.channel_id is None:
            return False
        queue = self.channels[question.channel_id].queue
        if question in queue:
            queue.remove(question)
            return True
        return False

    def move(self, question: Question, channel_id: int) -> None:
        """Take a waiting question out of its channel's queue and bind it to another channel."""
        assert self.remove(question)
        self.enqueue(channel_id, question)

    def start(self, question: Question) -> None:
        """The queue head starts running in its channel."""
        assert question.channel_id is not None  # bound when it was queued
        channel = self.channels[question.channel_id]
        assert channel.question is None and channel.queue and channel.queue[0] is question
        channel.queue.pop(0)
        channel.question = question
        channel.num_served += 1

    def release(self, channel_id: int) -> None:
        self.channels[channel_id].question = None
