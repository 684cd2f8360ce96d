"""Slow and stalled clients (issue 13, point 5): a connection that never finishes its headers or its body
is answered 408 and closed, connections past server.max_connections get a 503, and normal requests keep
working meanwhile. Raw sockets, a real `kev serve`."""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from harness import ServerProcess

pytestmark = [pytest.mark.service, pytest.mark.slow]
SLOW = {"server": {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "max_connections": 24}}


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    return start_server(SLOW, api_key="k")


def stalled(server: ServerProcess, first_bytes: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
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


def test_connections_past_the_cap_get_503_and_the_server_recovers(start_server) -> None:
    server = start_server({"server": {"header_timeout_s": 10.0, "max_connections": 24}})
    held = [stalled(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n") for _ in range(30)]  # past max_connections 24
    time.sleep(0.5)  # all accepted before the probe below (well inside the 10 s header deadline)
    refused = httpx.get(f"{server.url}/healthz", timeout=30)
    assert refused.status_code == 503
    for sock in held:
        read_until_closed(sock)  # the header deadline frees them
    assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
