"""Server tests: each module shares one real `kev serve` (the default model loads in seconds)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from harness import ServerProcess


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProcess]]:
    """start_server(config, api_key=None, extra_args=None): servers started here stop (SIGTERM) at module end."""
    servers: list[ServerProcess] = []

    def start(config: dict[str, Any] | None = None, api_key: str | None = None,
              extra_args: list[str] | None = None) -> ServerProcess:
        server = ServerProcess(config or {}, tmp_path_factory.mktemp("kev-serve"), api_key, extra_args or [])
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        code = server.terminate()
        assert code == 0, f"kev serve exited with {code} on SIGTERM:\n{server.log()[-3000:]}"


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

