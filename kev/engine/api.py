"""EngineAPI: what a front end (the server bridge, `kev batch`, the distributed worker) may call on an engine.

Engine (kev/engine/engine.py), the multi-device replica set (kev/engine/replicas.py) and the
cluster's router (kev/distributed/router_engine.py) implement it; front ends depend on this Protocol only.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from kev.results.result import Result
from kev.engine.request import EventListener, StreamEvent
from kev.engine.stats import EngineLoad
from kev.model.tokenizer import Tokenizer


class StepCounters(Protocol):
    """An engine's step counters (EngineStats, or the replicas' added up)."""

    @property
    def num_steps(self) -> int: ...

    @property
    def num_tokens_computed(self) -> int: ...

    @property
    def num_tokens_generated(self) -> int: ...

    @property
    def recent(self) -> Any:  # the most recent StepRecords, oldest first (a deque or a list)
        ...


class EngineAPI(Protocol):
    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def stats(self) -> StepCounters: ...

    @property
    def submit(self) -> Callable[..., str]:
        """submit(queries, sampling, **options): route the questions to channels; returns a request_id
        (Engine.submit)."""
        ...

    def results(self, request_id: str) -> list[Result]: ...

    def stream(self, request_id: str, timeout: float | None = None) -> Iterator[StreamEvent]: ...

    def cancel(self, request_id: str) -> None:
        """Unfinished questions end as cancelled; their results are in when this returns."""
        ...

    def cancel_unfinished(self) -> int:
        """Cancel every unfinished request; returns how many."""
        ...

    def forget(self, request_id: str) -> None: ...

    def subscribe(self, listener: EventListener) -> None:
        """Every event of every request, as made (on the engine's thread: hand off, never block)."""
        ...

    def channel_states(self) -> list[dict[str, Any]]: ...

    def queue_length(self) -> int: ...

    def load(self) -> EngineLoad: ...

    def alert_counts(self) -> dict[str, int]: ...

    def describe(self) -> dict[str, Any]: ...

    @property
    def failure(self) -> str | None:
        """Why the engine stopped for good (a tensor-parallel rank died; its questions failed), or None."""
        ...

    def close(self) -> None: ...
