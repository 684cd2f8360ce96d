"""Request: the questions submitted together, their results, and their stream of events."""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kev.results.result import Result
from kev.engine.question import Question


@dataclass
class StreamEvent:
    """One question's delta. Never mixes two questions."""

    index: int
    channel_id: int | None
    text: str
    token_ids: list[int]
    finished: bool = False
    result: Result | None = None  # set on the final event of a question
    logprobs: list[Any] = field(default_factory=list)  # one entry per token in token_ids (when logprobs were asked)
    request_id: str = ""  # whose question (set on every event of an engine's stream)


EventListener = Callable[[StreamEvent], None]


@dataclass
class Request:
    request_id: str
    num_questions: int
    isolation: str
    questions: dict[int, Question] = field(default_factory=dict)
    results: dict[int, Result] = field(default_factory=dict)
    events: queue.Queue[StreamEvent] = field(default_factory=queue.Queue)
    done: threading.Event = field(default_factory=threading.Event)

    def publish(self, event: StreamEvent, listeners: Sequence[EventListener] = ()) -> None:
        """Into this request's queue (Engine.stream), then to the engine's listeners (its one event stream)."""
        self.events.put(event)
        for listener in listeners:
            listener(event)

    def add_result(self, result: Result, listeners: Sequence[EventListener] = ()) -> None:
        """A question's final event; the request is done with its last one."""
        self.results[result.index] = result
        self.publish(StreamEvent(result.index, result.channel_id, "", [], True, result, request_id=self.request_id),
                     listeners)
        if len(self.results) == self.num_questions:
            self.done.set()

    def wait_done(self, timeout: float | None) -> None:
        if not self.done.wait(timeout):
            raise TimeoutError(f"request {self.request_id}: {len(self.results)}/{self.num_questions} results "
                               f"after {timeout}s")

    def iter_events(self, timeout: float | None) -> Iterator[StreamEvent]:
        """The request's events until every question's final one."""
        finished = 0
        while finished < self.num_questions:
            event = self.events.get(timeout=timeout)
            finished += event.finished
            yield event
