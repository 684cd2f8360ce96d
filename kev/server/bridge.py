"""The engine seen from the event loop: blocking calls run in a thread pool, stream events cross over.

Each submitted request gets one watcher thread that drains its engine stream until every
question has finished: it counts results in the metrics and, when a caller listens,
hands each event to the loop. A watcher always ends, because every question finishes
(answer, timeout or cancel), which is why shutdown cancels what is still running.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kev.engine.engine import Engine
from kev.engine.request import StreamEvent
from kev.server.metrics import ServerMetrics

log = logging.getLogger("kev.server")
T = TypeVar("T")


@dataclass
class Watch:
    """One request's watcher, as seen from the loop."""

    request_id: str
    num_questions: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Event = field(default_factory=asyncio.Event)
    events: asyncio.Queue[StreamEvent | None] | None = None  # only when a caller streams
    finished_at: float | None = None  # time.monotonic() when the last question finished

    def post(self, event: StreamEvent | None) -> None:
        """From the watcher thread: hand an event (None = the end) to the loop."""
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

    async def stream(self) -> AsyncIterator[StreamEvent]:
        assert self.events is not None, "watch(listen=True) to stream"
        while (event := await self.events.get()) is not None:
            yield event


class EngineBridge:
    def __init__(self, engine: Engine, metrics: ServerMetrics, max_threads: int) -> None:
        self.engine, self.metrics = engine, metrics
        self.pool = ThreadPoolExecutor(max_threads, thread_name_prefix="kev-http")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking engine call off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    async def submit(self, queries: list[Any], options: dict[str, Any]) -> str:
        """engine.submit off the loop; if our caller goes away meanwhile, the request is forgotten, not orphaned."""
        future = asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(self.engine.submit, queries, **options))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._forget_orphan)
            raise

    def _forget_orphan(self, future: asyncio.Future[str]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.run_soon(self.engine.forget, future.result())

    def run_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Fire and forget (usable from a `finally` of a cancelled task, where awaiting is not possible)."""
        self.pool.submit(_logged, fn, *args)

    def watch(self, request_id: str, num_questions: int, listen: bool) -> Watch:
        loop = asyncio.get_running_loop()
        watch = Watch(request_id, num_questions, loop, events=asyncio.Queue() if listen else None)
        # A daemon thread, not a pool worker: a watcher lives as long as its request.
        threading.Thread(target=self._drain, args=(watch,), name=f"kev-watch-{request_id}", daemon=True).start()
        return watch

    def _drain(self, watch: Watch) -> None:
        try:
            for event in self.engine.stream(watch.request_id):
                if event.result is not None:
                    self.metrics.observe_result(event.result)
                if watch.events is not None:
                    watch.post(event)
        except Exception:
            log.exception("watcher of request %s failed", watch.request_id)
        finally:
            watch.post(None)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _logged(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("background engine call %s failed", getattr(fn, "__name__", fn))
