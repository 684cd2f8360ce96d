"""Slow or stalled clients cannot hold connections (and file descriptors) forever, nor starve real clients.

uvicorn closes idle keep-alive connections (timeout_keep_alive), but a client that never
finishes its request headers is kept open for ever. GuardedH11Protocol is uvicorn's h11
protocol with a header deadline and a body deadline (a connection still inside, or not yet
at, its request headers, or inside its body, past the deadline gets a 408 and is closed), and
the admission rules of its server's ConnectionBook (kev.server.connection_book): a cap per
client address, a reserve of slots for connections that have sent a whole request (a new
connection evicts the one that has waited longest for its headers), and deadlines that
tighten as the server fills. Authentication is checked only after the headers, so this is what
stops an unauthenticated flood. The gate middleware keeps its own full body deadline
(server.body_timeout_s); this one is that deadline shortened while the server is full.

Behind a trusted proxy (server.forwarded_allow_ips) a connection is admitted by its peer, the proxy, before any
header is read: at that point the proxy's address is all there is, and it has no cap (it carries every client).
Once a request's headers are in, its X-Forwarded-For is read exactly as uvicorn's ProxyHeadersMiddleware reads it
(the same trust rule, the same hop), and the request counts against that client address's cap until it is
answered; one over the cap gets a 503 with Retry-After before the app sees it. So a client behind the proxy holds
at most max_connections_per_client requests at once; what it cannot be charged for is a connection the proxy opened
and has not yet sent headers on (a proxy that buffers requests, as nginx does by default, never trickles them).
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Container, MutableMapping
from typing import Any

import h11
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.h11_impl import H11Protocol

from kev.config.server_config import ServerConfig
from kev.server.connection_book import ConnectionBook
from kev.wire.bodies.errors import error_body

REFUSAL_S = 1.0  # a refused connection gets its 503 when it sends its request, or after this long
Scope = MutableMapping[str, Any]
Asgi = Callable[[Scope, Any, Any], Awaitable[None]]


def timeout_response(message: str, field: str) -> bytes:
    return _response(b"408 Request Timeout", error_body(408, message, field, "timeout"))


def unavailable_response(message: str) -> bytes:
    return _response(b"503 Service Unavailable", error_body(503, message, None), b"retry-after: 1\r\n")


def _response(status: bytes, body_json: dict[str, object], extra: bytes = b"") -> bytes:
    body = json.dumps(body_json).encode()
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n%s"
            b"content-length: %d\r\n\r\n%s" % (status, extra, len(body), body))


async def _ignore(scope: Scope, receive: Any, send: Any) -> None:
    return None


async def forwarded_client(proxy_headers: ProxyHeadersMiddleware, scope: Scope) -> str | None:
    """The client address uvicorn's ProxyHeadersMiddleware puts in scope["client"] for this request (the peer itself
    when it is not a trusted proxy or sends no X-Forwarded-For): it runs on a copy of the scope."""
    probe = dict(scope)
    await proxy_headers(probe, _ignore, _ignore)  # type: ignore[arg-type]  # it only rewrites probe, then calls _ignore
    client = probe.get("client")
    return str(client[0]) if client else None


class GuardedH11Protocol(H11Protocol):
    book: ConnectionBook  # set by guarded_h11(): one per server
    proxy_headers: ProxyHeadersMiddleware | None = None  # server.forwarded_allow_ips set: who is trusted, and how
    header_timeout_s = 10.0
    body_timeout_s = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # h11 narrows it too
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_for: object | None = None  # the h11 state its deadline is for
        self._address = self.client[0] if self.client else "unknown"
        self._over_cap = self.book.is_over_cap(self._address)  # refused for its address's cap, unless it proves real
        self._refused = self.book.admit(self, self._address)
        if self._refused is not None:
            self._timer = self.loop.call_later(REFUSAL_S, self._refuse)
            return
        if self.proxy_headers is not None and self._address in self.book.proxies:
            self.app = self._counted_by_forwarded_client(self.app)
        self._follow(h11.IDLE)

    def _counted_by_forwarded_client(self, app: Asgi) -> Asgi:
        """The app for a trusted proxy's connection: each request counts against its X-Forwarded-For client."""
        assert self.proxy_headers is not None
        proxy_headers, proxy = self.proxy_headers, self._address

        async def counted(scope: Scope, receive: Any, send: Any) -> None:
            client = await forwarded_client(proxy_headers, scope) if scope["type"] == "http" else None
            if client is None or client == proxy:
                return await app(scope, receive, send)
            refused = self.book.begin_forwarded(client, proxy)
            if refused is not None:
                body = json.dumps(error_body(503, f"request refused: {refused}", None)).encode()
                await send({"type": "http.response.start", "status": 503, "headers": [
                    (b"content-type", b"application/json"), (b"retry-after", b"1"),
                    (b"content-length", str(len(body)).encode())]})
                return await send({"type": "http.response.body", "body": body})
            try:
                await app(scope, receive, send)
            finally:
                self.book.end_forwarded(client)

        return counted

    def data_received(self, data: bytes) -> None:
        if self._refused is not None and self._over_cap and b"\r\n\r\n" in data:  # whole headers at once: real
            if self.book.admit_complete(self, self._address) is None:
                self._refused, self._over_cap = None, False
                self._disarm()
        if self._refused is not None:  # its request has (begun to) arrive: answer it the 503
            return self._refuse()
        super().data_received(data)
        self._follow(self.conn.their_state)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.book.close(self)
        super().connection_lost(exc)

    def evict(self) -> None:
        """The server is full and this connection has waited longest for a request that never came whole."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(timeout_response(
                "headers: not complete in time (evicted: the server is full of connections that have not sent a "
                f"request; server.header_timeout_s={self.header_timeout_s:g})", "headers"))
            self.transport.close()

    def _follow(self, state: object) -> None:
        """A deadline for the part of the request the client is sending now; none once a whole request is in."""
        if state is h11.IDLE or state is h11.SEND_BODY:
            if self._timer_for is not state:
                self._disarm()
                full = self.header_timeout_s if state is h11.IDLE else self.body_timeout_s
                self._timer = self.loop.call_later(self.book.deadline(full), self._too_slow, state)
                self._timer_for = state
        else:
            self._disarm()
            self.book.sent_request(self)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_for = None, None

    def _too_slow(self, state: object) -> None:
        self._timer, self._timer_for = None, None
        if self.transport.is_closing() or self.conn.their_state is not state:
            return
        if self.cycle is not None and (state is h11.IDLE and not self.cycle.response_complete
                                       or state is h11.SEND_BODY and self.cycle.response_started):
            return  # a response is being written (pipelining, or an early answer): not the client's stall
        if state is h11.IDLE:
            message, field = f"headers: not complete within server.header_timeout_s={self.header_timeout_s:g}", \
                "headers"
        else:
            message, field = f"body: not complete within server.body_timeout_s={self.body_timeout_s:g}", "body"
        if self.book.deadline(1.0) < 1.0:
            message += " (shortened while the server is full)"
        self.transport.write(timeout_response(message, field))
        self.transport.close()

    def _refuse(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(unavailable_response(f"connection refused: {self._refused}"))
            self.transport.close()


def guarded_h11(server: ServerConfig) -> type[GuardedH11Protocol]:
    """uvicorn.Config(http=...) takes a class: one with this server's deadlines and its own ConnectionBook."""
    # uvicorn's own reader of the setting (addresses, networks, "*"): the book and forwarded_client trust alike
    proxy_headers = (ProxyHeadersMiddleware(_ignore, server.forwarded_allow_ips)  # type: ignore[arg-type]
                     if server.forwarded_allow_ips else None)
    proxies: Container[str] = (proxy_headers.trusted_hosts  # type: ignore[assignment]  # __contains__(str | None)
                               if proxy_headers is not None else frozenset())
    book = ConnectionBook(server.max_connections, server.max_connections_per_client, server.reserve_slots,
                          proxies=proxies)
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {
        "book": book, "proxy_headers": proxy_headers, "header_timeout_s": server.header_timeout_s,
        "body_timeout_s": server.body_timeout_s})
