"""Stored responses (`store`, default true), per tenant: what GET /v1/responses/{id} returns and what
previous_response_id continues. Kept in memory (a restart forgets them; a continuation of one forgotten is a 404
naming the id): at most MAX_STORED per server, and per tenant its share of them (the tenant's weight over all
tenants' weight, as sharing.tenant_max_retained_results shares retained results), so one tenant storing many
responses evicts its own oldest, never another's. Past the server's cap the oldest of the tenant holding the most
goes."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_STORED = 2048


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the Response object as returned
    messages: list[dict[str, Any]]  # the conversation it answered, then its own answer: chat messages


class ResponseStore:
    def __init__(self, capacity: int = MAX_STORED, tenant_capacity: Callable[[str], int] | None = None) -> None:
        """tenant_capacity: tenant -> its share of capacity (None: the whole)."""
        self.capacity = capacity
        self.tenant_capacity = tenant_capacity or (lambda _: capacity)
        self._tenants: dict[str, OrderedDict[str, Stored]] = {}  # tenant -> its responses, oldest first
        self._count = 0
        self._lock = threading.Lock()

    def put(self, tenant: str, stored: Stored) -> None:
        with self._lock:
            own = self._tenants.setdefault(tenant, OrderedDict())
            response_id = stored.response["id"]
            self._count += response_id not in own
            own[response_id] = stored
            own.move_to_end(response_id)
            while len(own) > max(1, min(self.tenant_capacity(tenant), self.capacity)):
                self._pop_oldest(tenant)
            while self._count > self.capacity:
                # the tenant holding the most gives up its oldest (the first such tenant on a tie)
                self._pop_oldest(max(self._tenants, key=lambda t: len(self._tenants[t])))

    def _pop_oldest(self, tenant: str) -> None:
        own = self._tenants[tenant]
        own.popitem(last=False)
        self._count -= 1
        if not own:
            del self._tenants[tenant]

    def get(self, tenant: str, response_id: str) -> Stored | None:
        """Only the tenant's own: another tenant's id is as unknown as a made-up one."""
        with self._lock:
            own = self._tenants.get(tenant)
            return None if own is None else own.get(response_id)

    def delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            own = self._tenants.get(tenant)
            if own is None or own.pop(response_id, None) is None:
                return False
            self._count -= 1
            if not own:
                del self._tenants[tenant]
            return True

    def held(self, tenant: str) -> int:
        with self._lock:
            return len(self._tenants.get(tenant, ()))
