"""server.forwarded_allow_ips and the per-client cap (kev/server/slow_clients.py): a trusted proxy's own address has
no cap (it carries every client), and each request through it counts, from its headers until it is answered, against
the client its X-Forwarded-For names, as uvicorn's ProxyHeadersMiddleware reads it. Kev's protocol on a real uvicorn
server in this process, with a tiny app that holds requests until the test lets them go (no model, no timing)."""
from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from harness import wait_until

from kev.config.server_config import ServerConfig
from kev.server.slow_clients import guarded_h11

CLIENT, OTHER = "10.1.1.1", "10.2.2.2"


class HoldingApp:
    """/hold waits until release is set; every request answers 200 with the client address the app was given."""

    def __init__(self) -> None:
        self.release, self.held, self.lock = threading.Event(), 0, threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        if scope["path"] == "/hold":
            with self.lock:
                self.held += 1
            await asyncio.to_thread(self.release.wait, 120)
        body = scope["client"][0].encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def served() -> Iterator[tuple[str, HoldingApp, Any]]:
    settings = ServerConfig(max_connections_per_client=2, forwarded_allow_ips=["127.0.0.1"])
    protocol, app = guarded_h11(settings), HoldingApp()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol, lifespan="off", log_level="warning", proxy_headers=True,
                            forwarded_allow_ips=settings.forwarded_allow_ips)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="the server started")
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", app, protocol.book
    app.release.set()
    server.should_exit = True
    thread.join(60)


def get(url: str, forwarded_for: str | None = None, source: str = "127.0.0.1") -> httpx.Response:
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=120) as client:
        return client.get(url, headers=headers)


def test_a_client_behind_a_trusted_proxy_is_capped_by_its_forwarded_address(served: tuple[str, HoldingApp, Any]):
    url, app, book = served
    held: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: held.append(get(f"{url}/hold", CLIENT))) for _ in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: app.held == 2, what="two requests of one client held")  # the client's cap of 2, both in use
    refused = get(f"{url}/now", CLIENT)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
    assert CLIENT in refused.text and "max_connections_per_client=2" in refused.text, refused.text
    beside = get(f"{url}/now", OTHER)  # another client through the same proxy
    assert beside.status_code == 200 and beside.text == OTHER
    assert get(f"{url}/now").text == "127.0.0.1"  # the proxy itself: no cap of its own
    untrusted = get(f"{url}/now", CLIENT, source="127.0.0.2")  # not a trusted proxy: its header names no one
    assert untrusted.status_code == 200 and untrusted.text == "127.0.0.2"
    app.release.set()
    for thread in threads:
        thread.join(120)
    assert [r.status_code for r in held] == [200, 200] and {r.text for r in held} == {CLIENT}
    assert get(f"{url}/now", CLIENT).text == CLIENT  # answered requests no longer count
    # A request's count ends when the app returns, just after its last byte is written: its client can read the
    # answer first, so the book is read once it has caught up (a loaded machine failed the immediate read).
    wait_until(lambda: CLIENT not in book.per_client, what="the answered requests' counts released")
