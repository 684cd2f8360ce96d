"""The request plumbing shared by every engine behind EngineAPI (Engine, ReplicaEngine, RouterEngine): one
lookup, one way to wait for a request, read its results in aggregator order and stream its events.

Each engine says how its results are ordered (_ordered), which Request holds its events (_view) and on which thread
its requests may be read (_home: in place, or on the cluster router's event loop)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from kev.results.result import Result
from kev.engine.request import Request, StreamEvent
from kev.engine.sampling_params import SamplingParams
from kev.errors import UnknownRequestError

R = TypeVar("R")
T = TypeVar("T")


class RequestFront(ABC, Generic[R]):
    requests: dict[str, R]
    submit: Callable[..., str]  # each engine's own: submit(queries, sampling, **options) -> request_id

    # --- what each engine says -----------------------------------------------------
    @abstractmethod
    def _ordered(self, request: R) -> list[Result]:
        """The request's results so far, in aggregator.mode's order."""

    def _view(self, request: R) -> Request:
        assert isinstance(request, Request)
        return request

    def _home(self, read: Callable[[], T]) -> T:
        return read()

    # --- the same for all ------------------------------------------------------------
    def results(self, request_id: str) -> list[Result]:
        """The results available now (all of them once the request is done), ordered by aggregator.mode."""
        return self._home(lambda: self._ordered(self._request(request_id)))

    def stream(self, request_id: str, timeout: float | None = None) -> Iterator[StreamEvent]:
        """Per-question deltas as they are produced; ends after every question's final event."""
        yield from self._home(lambda: self._view(self._request(request_id))).iter_events(timeout)

    def wait(self, request_id: str, timeout: float | None = None) -> list[Result]:
        """Block until every question of the request has a result."""
        self._home(lambda: self._view(self._request(request_id))).wait_done(timeout)
        return self.results(request_id)

    def generate(self, queries: list[Any], sampling: SamplingParams | None = None, timeout: float | None = None,
                 **options: Any) -> list[Result]:
        """submit() then wait(): the one-call form."""
        return self.wait(self.submit(queries, sampling, **options), timeout)

    def _request(self, request_id: str) -> R:
        request = self.requests.get(request_id)
        if request is None:
            raise UnknownRequestError(f"request_id {request_id!r} is unknown")
        return request
