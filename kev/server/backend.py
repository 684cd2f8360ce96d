"""Backend: the seam between the HTTP edge and whatever answers the questions.

Two implementations: EngineBridge (kev/server/bridge.py: an engine, or one engine replica
per device, in this process) and DistributedBackend (kev/distributed/router_backend.py:
workers and an aggregator over NATS JetStream). The routes cannot tell them apart, which is
why a client cannot either.
"""
from __future__ import annotations

from typing import Any, Protocol

from kev.aggregator.result import Result
from kev.config import KevConfig
from kev.engine.api import StepCounters
from kev.engine.stats import EngineLoad
from kev.model.tokenizer import Tokenizer
from kev.server.metrics import ServerMetrics
from kev.server.watch import Watch


class Backend(Protocol):
    @property
    def tokenizer(self) -> Tokenizer:
        """The served model's (the tokenizer routes, token-id prompts)."""
        ...

    @property
    def unavailable(self) -> str | None:
        """Why new work is refused right now (HTTP 503), or None."""
        ...

    @property
    def degraded(self) -> str | None:
        """A service on the request path is down, so readiness fails, though new work still waits for it; or None."""
        ...

    @property
    def failure(self) -> str | None:
        """Why the backend can never answer again (a tensor-parallel rank died): the server stops, exit non-zero."""
        ...

    def start(self) -> None:
        """On the event loop, once: begin whatever runs in the background (connections)."""
        ...

    async def submit(self, queries: list[Any], options: dict[str, Any]) -> str:
        """Accept the questions; returns the request_id. Raises InvalidRequestError, RejectedError,
        TimeoutError (overflow `wait`) or UnavailableError, as Engine.submit does."""
        ...

    def watch(self, request_id: str, num_questions: int, listen: bool) -> Watch: ...

    async def results(self, request_id: str) -> list[Result]:
        """The results so far, in aggregator.mode order."""
        ...

    async def cancel(self, request_id: str) -> None: ...

    def forget(self, request_id: str) -> None:
        """Cancel what is left and drop the request; never awaits."""
        ...

    async def channels(self) -> tuple[list[dict[str, Any]], int]:
        """Every channel's state, and the number of questions waiting for one."""
        ...

    async def stats(self) -> StepCounters:
        """Step counters and the most recent steps (a cluster's steps happen on its workers: counters only)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What serves: model, precision, device, pool and KV sizes (or the cluster a router feeds): the banner."""
        ...

    async def load(self) -> EngineLoad:
        """Questions running and waiting, KV blocks in use, prefix-cache counters (all engines added up)."""
        ...

    async def refresh_metrics(self) -> None: ...

    async def cancel_unfinished(self) -> int:
        """Cancel every unfinished question (each caller gets its cancelled results); returns how many requests."""
        ...

    async def shutdown(self) -> int:
        """Cancel what is unfinished and let go of everything; returns how many requests were cancelled."""
        ...


def build_backend(config: KevConfig, metrics: ServerMetrics, engine_factory: Any) -> Backend:
    """The backend for config.deploy.mode; runs in a loader thread (it loads models)."""
    from kev.server.bridge import EngineBridge

    max_threads = config.server.max_inflight_requests + 16
    if config.deploy.mode == "distributed":
        from kev.distributed.router_backend import DistributedBackend

        return DistributedBackend(config, metrics)
    if config.deploy.mode == "multi_gpu" and engine_factory is None:
        from kev.distributed.replicas import ReplicaEngine

        return EngineBridge(ReplicaEngine(config), metrics, max_threads)
    if engine_factory is None:
        from kev.engine.engine import Engine

        engine_factory = Engine
    return EngineBridge(engine_factory(config), metrics, max_threads)
