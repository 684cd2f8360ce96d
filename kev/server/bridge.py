"""EngineBridge: the Backend of single and multi_gpu mode: an engine in this process, seen from the event loop.

Blocking engine calls run in a thread pool. The bridge subscribes once to the engine's event
stream and routes each event to its request's Watch: a final event counts its result in the
metrics; a delta goes to the loop only when a caller streams (no per-token wake-ups otherwise).
A watch always ends, because every question finishes (answer, timeout or cancel), which is why
shutdown cancels what is still running.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kev.aggregator.result import Result
from kev.engine.api import EngineAPI, StepCounters
from kev.engine.events import EventRouter
from kev.engine.request import StreamEvent
from kev.engine.stats import EngineLoad
from kev.model.tokenizer import Tokenizer
from kev.server.metrics import ServerMetrics
from kev.server.watch import Watch

log = logging.getLogger("kev.server")
T = TypeVar("T")


class EngineBridge:
    degraded: str | None = None  # a local engine needs nothing else

    def __init__(self, engine: EngineAPI, metrics: ServerMetrics, max_threads: int) -> None:
        self.engine, self.metrics = engine, metrics
        self.pool = ThreadPoolExecutor(max_threads, thread_name_prefix="kev-http")
        self.events = EventRouter()
        engine.subscribe(self.events)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def unavailable(self) -> str | None:
        """A local engine, once loaded, takes work until it fails for good."""
        return self.engine.failure

    @property
    def failure(self) -> str | None:
        return self.engine.failure

    def start(self) -> None:
        """Nothing to start: the engine's loop already runs."""

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking engine call off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    async def submit(self, queries: list[Any], options: dict[str, Any]) -> str:
        """engine.submit off the loop; if our caller goes away meanwhile, the request is forgotten, not orphaned."""
        call = functools.partial(self.engine.submit, queries, **options)
        future = asyncio.get_running_loop().run_in_executor(self.pool, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._forget_orphan)
            raise

    def _forget_orphan(self, future: asyncio.Future[str]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.forget(future.result())

    async def results(self, request_id: str) -> list[Result]:
        return await self.run(self.engine.results, request_id)

    async def cancel(self, request_id: str) -> None:
        await self.run(self.engine.cancel, request_id)

    def forget(self, request_id: str) -> None:
        """Cancel what is left and drop the request; never awaits (usable from a `finally` of a cancelled task)."""
        self.run_soon(self._forget, request_id)

    def _forget(self, request_id: str) -> None:
        self.engine.forget(request_id)  # its cancelled finals reach the watch first
        self.events.drop(request_id)

    def run_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Fire and forget."""
        self.pool.submit(_logged, fn, *args)

    async def channels(self) -> tuple[list[dict[str, Any]], int]:
        """Every channel's state, and the number of questions waiting for one."""
        return await self.run(self.engine.channel_states), await self.run(self.engine.queue_length)

    async def stats(self) -> StepCounters:
        return self.engine.stats

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()

    async def load(self) -> EngineLoad:
        return await self.run(self.engine.load)

    async def refresh_metrics(self) -> None:
        states, queue_length = await self.channels()
        self.metrics.refresh(list(self.engine.stats.recent), states, queue_length, self.engine.alert_counts(),
                             await self.load())

    def watch(self, request_id: str, num_questions: int, listen: bool) -> Watch:
        watch = Watch(request_id, num_questions, asyncio.get_running_loop(), events=asyncio.Queue() if listen else None)
        finished = [0]

        def on_event(event: StreamEvent) -> None:  # on the engine's thread, its lock held: hand off only
            if event.result is None:
                if watch.events is not None:
                    watch.post(event)
                return
            self.metrics.observe_result(event.result)
            watch.post(event)  # its status counts, streamed or not
            finished[0] += 1
            if finished[0] == num_questions:
                watch.post(None)

        self.events.route(request_id, on_event)
        return watch

    async def cancel_unfinished(self) -> int:
        return await self.run(self.engine.cancel_unfinished)

    async def shutdown(self) -> int:
        """Cancel whatever still runs (including requests whose caller left), close the engine; returns how many."""
        unfinished = await self.cancel_unfinished()
        await self.run(self.engine.close)
        self.pool.shutdown(wait=False, cancel_futures=True)
        return unfinished


def _logged(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("background engine call %s failed", getattr(fn, "__name__", fn))
