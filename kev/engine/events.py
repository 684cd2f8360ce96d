"""EventRouter: hands one engine's event stream to per-request handlers (what every front end subscribes).

An engine emits the events of all its requests on one stream (Engine.subscribe). A front end
learns a request_id only when submit() returns, and by then the engine may have emitted that
request's first events (an error result is emitted inside submit): the router holds them until
the request's handler is set, then replays them in order.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from kev.engine.request import StreamEvent

Handler = Callable[[StreamEvent], None]


class EventRouter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handlers: dict[str, Handler] = {}
        self._early: dict[str, list[StreamEvent]] = {}  # events of requests without a handler yet

    def __call__(self, event: StreamEvent) -> None:
        """The engine listener: called on the engine's thread, one event at a time."""
        with self._lock:
            handler = self._handlers.get(event.request_id)
            if handler is None:
                self._early.setdefault(event.request_id, []).append(event)
                return
        handler(event)

    def route(self, request_id: str, handler: Handler) -> None:
        """From now on, request_id's events go to handler; those emitted before go first."""
        with self._lock:
            for event in self._early.pop(request_id, []):
                handler(event)
            self._handlers[request_id] = handler

    def drop(self, request_id: str) -> None:
        """Forget the request: its later events (and any held ones) are discarded."""
        with self._lock:
            self._handlers.pop(request_id, None)
            self._early.pop(request_id, None)
