"""Stored responses (`store`, default true), per tenant: what GET /v1/responses/{id} returns and what
previous_response_id continues. Kept in memory, the newest MAX_STORED per server (a restart forgets them; a
continuation of one forgotten is a 404 naming the id)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED = 2048


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the Response object as returned
    messages: list[dict[str, Any]]  # the conversation it answered, then its own answer: chat messages


class ResponseStore:
    def __init__(self, capacity: int = MAX_STORED) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str], Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, tenant: str, stored: Stored) -> None:
        with self._lock:
            self._items[(tenant, stored.response["id"])] = stored
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, tenant: str, response_id: str) -> Stored | None:
        """Only the tenant's own: another tenant's id is as unknown as a made-up one."""
        with self._lock:
            return self._items.get((tenant, response_id))

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            return self._items.pop((tenant, response_id), None) is not None
