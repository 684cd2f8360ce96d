"""Slow and stalled clients (issue 13, point 5; issue 24): a connection that never finishes its headers or its
body is answered 408 and closed, one address cannot hold more than its share of connections, stalled ones
make room for real clients, and normal requests keep working meanwhile. Raw sockets, a real `kev serve`."""
from __future__ import annotations

import socket

import httpx
import pytest
from harness import ServerProcess

pytestmark = [pytest.mark.service, pytest.mark.slow]
SLOW = {"server": {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "max_connections": 24}}


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    return start_server(SLOW, api_key="k")


def stalled(server: ServerProcess, first_bytes: bytes, source: str = "127.0.0.1") -> socket.socket:
    """A connection (from `source`, any loopback address) that sends first_bytes and then nothing."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=(source, 0))
    sock.sendall(first_bytes)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """What the server sends before it closes (30 s at most: far beyond the 1 s deadlines)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return data


def test_stalled_headers_and_bodies_are_closed_while_normal_requests_work(server: ServerProcess) -> None:
    headers = [stalled(server, b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: appl") for _ in range(8)]
    silent = [stalled(server, b"") for _ in range(4)]
    bodies = [stalled(server, b"POST /v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                              b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"queries\"")
              for _ in range(4)]
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as client:
        assert client.get("/healthz").status_code == 200  # served beside 16 stalled connections
        answered = client.post("/v1/query", json={"queries": ["Hi"], "max_tokens": 2})
        assert answered.status_code == 200 and answered.json()["results"][0]["status"] == "ok"
    for sock in headers + silent:
        reply = read_until_closed(sock)
        assert reply.startswith(b"HTTP/1.1 408") and b"server.header_timeout_s" in reply, reply
    for sock in bodies:
        reply = read_until_closed(sock)
        assert reply.startswith(b"HTTP/1.1 408") and b"server.body_timeout_s" in reply, reply


def test_stalled_sockets_cannot_lock_real_clients_out(start_server) -> None:
    """Issue 24: sockets that trickle their headers once filled server.max_connections and every real client got
    503; issue 37: 1,000 from one address locked out every client at that address. Now one address holds
    max_connections_per_client at most (more: 503, unless the new one's first bytes are a whole request: it takes
    the place of the address's longest waiting, 408); sockets from many
    addresses that never finish a request make room for a new connection (the longest waiting is evicted: 408);
    and real clients, from the tricklers' own address too, are answered beside them all."""
    server = start_server({"server": {"header_timeout_s": 5.0, "max_connections": 24,
                                      "max_connections_per_client": 10}}, api_key="k")
    head = b"POST /v1/query HTTP/1.1\r\nHost: x\r\n"
    one_address = [stalled(server, head, "127.0.0.1") for _ in range(40)]  # the real client's address
    many_addresses = [stalled(server, head, f"127.0.0.{3 + i % 3}") for i in range(24)]  # 8 each: under the cap
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as client:
        for _ in range(5):  # 64 stalled sockets opened, 24 the server's limit: still answered
            answered = client.post("/v1/query", json={"queries": ["Hi"], "max_tokens": 2})
            assert answered.status_code == 200 and answered.json()["results"][0]["status"] == "ok", answered.text
    replies = [read_until_closed(sock) for sock in one_address + many_addresses]
    refused = [r for r in replies[:40] if r.startswith(b"HTTP/1.1 503")]
    assert len(refused) == 30 and all(b"server.max_connections_per_client=10" in r for r in refused), refused[:1]
    assert all(r.startswith((b"HTTP/1.1 503", b"HTTP/1.1 408")) for r in replies), [r[:60] for r in replies]
    assert any(b"evicted" in r for r in replies) and any(b"server.header_timeout_s=5" in r for r in replies)
    assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
