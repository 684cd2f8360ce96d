"""Server tests: each module shares one real `kev serve` (the default model loads in seconds)."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from harness import ServerProcess


@pytest.fixture(scope="module")
def client_for() -> Iterator[Callable[[ServerProcess], httpx.Client]]:
    clients: list[httpx.Client] = []

    def make(server: ServerProcess) -> httpx.Client:
        client = httpx.Client(base_url=server.url, headers=server.headers, timeout=120)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
