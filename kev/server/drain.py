"""DrainingServer: how `kev serve` stops on SIGTERM or Ctrl-C, at any moment, loading included.

1. New work is refused: the listening socket stays open while in-flight requests finish (at most
   server.shutdown_grace_s), so a newcomer gets a 503 with Retry-After (not "connection refused"), and
   /health, /readyz say "draining"; then the socket closes.
2. In-flight requests may finish for server.shutdown_grace_s.
3. Then every unfinished question is cancelled, and each caller still gets a well-formed
   answer: JSON results / a final SSE event per question with status (finish_reason)
   cancelled. uvicorn's own deadline comes CANCEL_MARGIN_S later, so nobody is torn off.
4. The backend is let go and the process exits 0. If the model is still loading then, the
   process exits at once (os._exit): a half-built model cannot be stopped from Python, and
   tearing the interpreter down beside it aborts the process.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

import uvicorn

from kev.server.service import KevService

CANCEL_MARGIN_S = 5.0  # after the cancel, for handlers to write their last response


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: KevService, grace_s: float) -> None:
        super().__init__(config)
        self.service, self.grace_s = service, grace_s
        self._cancelling: asyncio.Task[None] | None = None

    @staticmethod
    def timeout_for(grace_s: float) -> float:
        """uvicorn's timeout_graceful_shutdown for a grace period."""
        return grace_s + CANCEL_MARGIN_S

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.is_draining = True
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.grace_s, self._cancel_unfinished)
        try:
            await self._finish_in_flight(loop.time() + self.grace_s)
            await super().shutdown(sockets)
        finally:
            timer.cancel()
            if self._cancelling is not None:
                await self._cancelling

    async def _finish_in_flight(self, deadline: float) -> None:
        """Before the socket closes: wait for the requests that were running (a 503 to a newcomer ends at once)."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline and any(not task.done() for task in self.server_state.tasks):
            await asyncio.sleep(0.05)

    def _cancel_unfinished(self) -> None:
        self._cancelling = asyncio.ensure_future(self.service.cancel_unfinished())


def exit_if_loading(service: KevService, code: int) -> None:
    """Stopped while the model loads: leave now, cleanly (see the module docstring, step 4)."""
    if service.is_loading:
        logging.getLogger("kev.server").info("stopped while the model was loading; exiting")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
