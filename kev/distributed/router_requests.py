"""OpenRequest: a request as the router of a cluster holds it until its caller is done with it.

Answers arrive from the aggregator (each once per delivery; the first per index counts),
deltas too. Everything happens on the event loop, so there is no lock. Events wait here
until the HTTP route attaches its Watch, so nothing that arrives early is lost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from kev.aggregator.ordering import order_results
from kev.aggregator.result import Result
from kev.distributed.messages import DeltaMessage
from kev.distributed.relay import StreamPosition
from kev.engine.request import StreamEvent
from kev.server.watch import Watch


@dataclass
class OpenRequest:
    request_id: str
    num_questions: int
    mode: str  # aggregator.mode
    isolation: str
    published: set[int]  # indexes on the queue (the others were answered at the edge)
    priorities: dict[int, int] = field(default_factory=dict)
    originals: dict[int, str | None] = field(default_factory=dict)  # index -> original_text
    results: dict[int, Result] = field(default_factory=dict)
    seqs: dict[int, int] = field(default_factory=dict)  # index -> acceptance order at the aggregator
    positions: dict[int, StreamPosition] = field(default_factory=dict)
    partial: dict[int, tuple[str, list[int], int | None]] = field(default_factory=dict)  # streamed text, ids, channel
    pending: list[StreamEvent | None] = field(default_factory=list)  # until a watch attaches (None: the end)
    watch: Watch | None = None
    created: float = field(default_factory=time.monotonic)

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
        self._emit(StreamEvent(delta.index, delta.channel_id, new[0], new[1]))

    def add_result(self, result: Result, seq: int) -> bool:
        """True if it is the first answer of its question (later ones are duplicates)."""
        if result.index in self.results or not 0 <= result.index < self.num_questions:
            return False
        self.results[result.index] = result
        self.seqs[result.index] = seq
        self.partial.pop(result.index, None)
        position = self.positions.pop(result.index, StreamPosition())
        rest_text, rest_ids = result.text[position.chars:], result.token_ids[position.tokens:]
        if rest_text or rest_ids:  # the answer overtook its last deltas (they travel apart): close the stream with it
            self._emit(StreamEvent(result.index, result.channel_id, rest_text, rest_ids))
        self._emit(StreamEvent(result.index, result.channel_id, "", [], True, result))
        if self.is_done:
            self._emit(None)
        return True

    def partial_answer(self, index: int) -> tuple[str, list[int], int | None]:
        """What was streamed of an unfinished question (a cancelled one keeps it, as in single mode)."""
        return self.partial.get(index, ("", [], None))

    def ordered(self) -> list[Result]:
        results = list(self.results.values())
        if self.mode == "seq_append":  # the aggregator's acceptance order (answers from the edge come first)
            return sorted(results, key=lambda r: (self.seqs.get(r.index, -1), r.index))
        return order_results(results, self.mode, self.priorities)

    def attach(self, watch: Watch) -> None:
        self.watch = watch
        for event in self.pending:
            self._post(event)
        self.pending = []

    def _emit(self, event: StreamEvent | None) -> None:
        if self.watch is None:
            self.pending.append(event)
        else:
            self._post(event)

    def _post(self, event: StreamEvent | None) -> None:
        assert self.watch is not None
        self.watch.post(event)
