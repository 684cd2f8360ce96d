"""Watch: one request's progress as the event loop sees it (its end, and its events when a caller streams).

Whatever answers the questions (a local engine, replicas, a cluster) feeds it through post(),
from any thread; the routes await done or iterate stream().
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from kev.results.result import Result
from kev.engine.request import StreamEvent


@dataclass
class Watch:
    request_id: str
    num_questions: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Event = field(default_factory=asyncio.Event)
    events: asyncio.Queue[StreamEvent | None] | None = None  # only when a caller streams
    finished_at: float | None = None  # time.monotonic() when the last question finished
    statuses: Counter[str] = field(default_factory=Counter)  # results by status (the access log)
    results: list[Result] = field(default_factory=list)  # as they came: what a status shows once the engine forgot it
    on_finish: Callable[[Watch], None] | None = None  # on the loop, once the last question finished

    def post(self, event: StreamEvent | None) -> None:
        """Hand an event (None = the end) to the loop; safe from any thread. Every event is posted, streamed or not."""
        if event is not None and event.result is not None:
            self.statuses[event.result.status] += 1
            self.results.append(event.result)
        try:
            if self.events is not None:
                self.loop.call_soon_threadsafe(self.events.put_nowait, event)
            if event is None:
                self.loop.call_soon_threadsafe(self._finish)
        except RuntimeError:  # the loop is gone (shutdown); nobody is listening any more
            pass

    def _finish(self) -> None:
        self.finished_at = time.monotonic()
        self.done.set()
        if self.on_finish is not None:
            self.on_finish(self)

    async def stream(self) -> AsyncIterator[StreamEvent]:
        assert self.events is not None, "watch(listen=True) to stream"
        while (event := await self.events.get()) is not None:
            yield event
