"""Server tests: each module shares one real `kev serve` (the default model loads in seconds)."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from harness import ServerProcess

OPENAI_KEY = "sk-kev-test"


@pytest.fixture(scope="module")
def client_for() -> Iterator[Callable[[ServerProcess], httpx.Client]]:
    clients: list[httpx.Client] = []

    def make(server: ServerProcess) -> httpx.Client:
        client = httpx.Client(base_url=server.url, headers=server.headers, timeout=600)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture(scope="module")
def openai_server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    """A server behind an API key, as the OpenAI client expects (the OpenAI-compatible and scoring modules)."""
    return start_server({"router": {"default_timeout_ms": 600_000}}, api_key=OPENAI_KEY)


@pytest.fixture(scope="module")
def openai_client(openai_server: ServerProcess) -> Iterator[openai.OpenAI]:
    """The official `openai` client, unchanged, on that server."""
    with openai.OpenAI(base_url=f"{openai_server.url}/v1", api_key=OPENAI_KEY, max_retries=0, timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def kev_http(openai_server: ServerProcess, client_for: Callable[[ServerProcess], httpx.Client]) -> httpx.Client:
    """Plain HTTP to the same server: the Kev API and the tokenizer routes."""
    return client_for(openai_server)
