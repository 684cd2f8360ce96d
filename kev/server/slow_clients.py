"""Slow or stalled clients cannot hold connections (and file descriptors) forever.

uvicorn closes idle keep-alive connections (timeout_keep_alive) and caps connections
(limit_concurrency: server.max_connections, a 503 beyond), but a client that never
finishes its request headers is kept open for ever. guarded_h11(header_timeout_s) is
uvicorn's h11 protocol with a header deadline: a connection still inside (or not yet at)
its request headers after header_timeout_s gets a 408 and is closed. Authentication is
checked only after the headers, so this is what stops an unauthenticated flood. The body
deadline (server.body_timeout_s) is the gate middleware's: it reads every body anyway.
"""
from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kev.server.errors import error_body


def timeout_response(message: str, field: str) -> bytes:
    body = json.dumps(error_body(408, message, field, "timeout")).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


class GuardedH11Protocol(H11Protocol):
    header_timeout_s = 10.0  # set by guarded_h11()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # h11 narrows it too
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # (a part of) the next request's headers, not all of them
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being written (pipelining): not the client's stall
        self.transport.write(timeout_response(
            f"headers: not complete within server.header_timeout_s={self.header_timeout_s:g}", "headers"))
        self.transport.close()


def guarded_h11(header_timeout_s: float) -> type[GuardedH11Protocol]:
    """uvicorn.Config(http=...) takes a class: one with this header deadline."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})
