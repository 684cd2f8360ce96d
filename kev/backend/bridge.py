"""EngineBridge: the server's backend: an engine (EngineAPI), seen from the event loop.

The engine is an Engine (single mode), a ReplicaEngine (multi_gpu) or a cluster's router
(RouterEngine, distributed mode); the routes cannot tell them apart, which is why a
client cannot either.

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
from typing import Any, Protocol, TypeVar

from kev.engine.sampling_params import SamplingParams
from kev.results.result import Result
from kev.engine.api import EngineAPI, StepCounters
from kev.engine.events import EventRouter
from kev.engine.request import StreamEvent
from kev.engine.stats import EngineLoad
from kev.model.tokenizer import Tokenizer
from kev.backend.metrics import ServerMetrics
from kev.backend.watch import Watch

log = logging.getLogger("kev.server")
T = TypeVar("T")


class Readiness(Protocol):
    """Whether an engine that works through other services (a cluster's router: NATS) can take work now."""

    @property
    def unavailable(self) -> str | None:
        """Why new work is refused right now (HTTP 503), or None."""
        ...

    @property
    def degraded(self) -> str | None:
        """A service on the request path is down, so readiness fails, though new work still waits for it; or None."""
        ...

    @property
    def notice(self) -> str | None:
        """Ready, but short of something worth saying in /health's detail (a cluster worker gone); or None."""
        ...


class EngineBridge:
    def __init__(self, engine: EngineAPI, metrics: ServerMetrics, max_threads: int,
                 readiness: Readiness | None = None) -> None:
        """readiness: None for an engine in this process (once loaded, it always takes work)."""
        self.engine, self.metrics, self.readiness = engine, metrics, readiness
        self.pool = ThreadPoolExecutor(max_threads, thread_name_prefix="kev-http")
        self.events = EventRouter()
        engine.subscribe(self.events)

    @property
    def tokenizer(self) -> Tokenizer:
        """The served model's (the tokenizer routes, token-id prompts)."""
        return self.engine.tokenizer

    @property
    def unavailable(self) -> str | None:
        """Why new work is refused (HTTP 503): the engine failed for good, or a service it needs is down."""
        return self.engine.failure or (self.readiness.unavailable if self.readiness is not None else None)

    @property
    def degraded(self) -> str | None:
        return self.readiness.degraded if self.readiness is not None else None

    @property
    def notice(self) -> str | None:
        return self.readiness.notice if self.readiness is not None else None

    @property
    def failure(self) -> str | None:
        """Why the engine can never answer again (a tensor-parallel rank died): the server stops, exit non-zero."""
        return self.engine.failure

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking engine call off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    async def submit(self, queries: list[Any], sampling: SamplingParams, options: dict[str, Any]) -> str:
        """engine.submit off the loop; if our caller goes away meanwhile, the request is forgotten, not orphaned.

        Raises InvalidRequestError, RejectedError, TimeoutError (overflow `wait`) or UnavailableError."""
        call = functools.partial(self.engine.submit, queries, sampling, **options)
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
        """Step counters and the most recent steps (a cluster's steps happen on its workers: counters only)."""
        return await self.run(lambda: self.engine.stats)

    def describe(self) -> dict[str, Any]:
        """What serves: model, precision, device, pool and KV sizes (or the cluster a router feeds): the banner."""
        return self.engine.describe()

    async def load(self) -> EngineLoad:
        """Questions running and waiting, KV blocks in use, prefix-cache counters (all engines added up)."""
        return await self.run(self.engine.load)

    async def refresh_metrics(self) -> None:
        # Where the KV cache lives: the engine's device (a cluster router's workers: the config's core.device).
        self.metrics.vllm.kv_on_cpu = str(self.describe().get("device", self.metrics.device)).startswith("cpu")
        states, queue_length = await self.channels()
        stats, alerts = await self.stats(), await self.run(self.engine.alert_counts)
        self.metrics.refresh(list(stats.recent), states, queue_length, alerts, await self.load())

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
