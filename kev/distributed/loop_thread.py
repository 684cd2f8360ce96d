"""LoopThread: an asyncio event loop in a thread of its own, which other threads hand work to and wait on."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kev.errors import UnavailableError

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.is_stopped = False
        self._thread = threading.Thread(target=self._run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run the coroutine on the loop and wait for its outcome (never from the loop's own thread)."""
        if self.is_stopped:
            coroutine.close()
            raise UnavailableError(f"{self._thread.name} is shut down")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def call(self, fn: Callable[[], T]) -> T:
        """fn() on the loop (where the state it reads lives), and its value."""
        async def call() -> T:
            return fn()

        return self.run(call())

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Stop the loop after what it runs now; later run() calls raise UnavailableError."""
        self.is_stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)

    def _run_forever(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()
