"""OpenRequest: a request as the router of a cluster holds it until its caller is done with it.

Answers arrive from the aggregator (each once per delivery; the first per index counts),
deltas too. Everything happens on the router's event loop, so there is no lock. Its events go
to the router's listeners (its one event stream) and into its own queue (stream()), as an
engine's Request does.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kev.results.ordering import order_results
from kev.results.result import Result
from kev.distributed.messages import DeltaMessage
from kev.distributed.relay import StreamPosition
from kev.engine.request import EventListener, Request, StreamEvent


@dataclass
class OpenRequest:
    request_id: str
    num_questions: int
    mode: str  # aggregator.mode
    isolation: str
    published: set[int]  # indexes on the queue (the others were answered at the edge)
    priorities: dict[int, int] = field(default_factory=dict)
    originals: dict[int, str | None] = field(default_factory=dict)  # index -> original_text
    listeners: Sequence[EventListener] = ()  # the router's subscribers
    seqs: dict[int, int] = field(default_factory=dict)  # index -> acceptance order at the aggregator
    positions: dict[int, StreamPosition] = field(default_factory=dict)
    partial: dict[int, tuple[str, list[int], int | None]] = field(default_factory=dict)  # streamed text, ids, channel
    created: float = field(default_factory=time.monotonic)
    view: Request = field(init=False)  # the caller's: results, their events, done

    def __post_init__(self) -> None:
        self.view = Request(self.request_id, self.num_questions, self.isolation)

    @property
    def results(self) -> dict[int, Result]:
        return self.view.results

    @property
    def is_done(self) -> bool:
        return len(self.results) == self.num_questions

    def missing(self) -> list[int]:
        return [i for i in sorted(self.published) if i not in self.results]

    def add_delta(self, delta: DeltaMessage) -> None:
        if delta.index in self.results or delta.index not in self.published:
            return
        position = self.positions.setdefault(delta.index, StreamPosition())
        new = position.extend(delta.text_offset, delta.text, delta.token_offset, delta.token_ids)
        if new is None:
            return
        text, ids, _ = self.partial.get(delta.index, ("", [], None))
        self.partial[delta.index] = (text + new[0], ids + new[1], delta.channel_id)
        self._publish(delta.index, delta.channel_id, new[0], new[1])

    def add_result(self, result: Result, seq: int) -> bool:
        """True if it is the first answer of its question (later ones are duplicates)."""
        if result.index in self.results or not 0 <= result.index < self.num_questions:
            return False
        self.seqs[result.index] = seq
        self.partial.pop(result.index, None)
        position = self.positions.pop(result.index, StreamPosition())
        rest_text, rest_ids = result.text[position.chars:], result.token_ids[position.tokens:]
        if rest_text or rest_ids:  # the answer overtook its last deltas (they travel apart): close the stream with it
            self._publish(result.index, result.channel_id, rest_text, rest_ids)
        self.view.add_result(result, self.listeners)
        return True

    def partial_answer(self, index: int) -> tuple[str, list[int], int | None]:
        """What was streamed of an unfinished question (a cancelled one keeps it, as in single mode)."""
        return self.partial.get(index, ("", [], None))

    def ordered(self) -> list[Result]:
        results = list(self.results.values())
        if self.mode == "seq_append":  # the aggregator's acceptance order (answers from the edge come first)
            return sorted(results, key=lambda r: (self.seqs.get(r.index, -1), r.index))
        return order_results(results, self.mode, self.priorities)

    def _publish(self, index: int, channel_id: int | None, text: str, token_ids: list[int]) -> None:
        self.view.publish(StreamEvent(index, channel_id, text, token_ids, request_id=self.request_id), self.listeners)
