"""KevService: what every route shares: the engine (once loaded) behind its bridge, limits, registry, metrics.

Routes stay thin: they validate, call submit() / wait() / results() / release(), and format.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request as HttpRequest

from kev.aggregator.result import Result
from kev.config import KevConfig
from kev.engine.engine import Engine
from kev.errors import InvalidRequestError, RejectedError
from kev.server.bridge import EngineBridge
from kev.server.errors import ApiError
from kev.server.limits import Limits
from kev.server.metrics import ServerMetrics
from kev.server.registry import RequestRegistry, Tracked

log = logging.getLogger("kev.server")


class KevService:
    def __init__(self, config: KevConfig, metrics: ServerMetrics) -> None:
        self.config, self.metrics = config, metrics
        self.limits = Limits.from_config(config)
        server = config.server
        self.registry = RequestRegistry(server.max_inflight_requests, server.result_ttl_s, server.max_retained_results)
        self.model_name = server.model_name or Path(config.core.model_path).name.removesuffix(".gguf")
        self.retry_after = {"Retry-After": str(server.retry_after_s)}
        self.bridge: EngineBridge | None = None
        self.load_error: str | None = None
        self.is_draining = False
        self.started_at = time.time()

    # --- life ----------------------------------------------------------------
    def attach(self, engine: Engine) -> None:
        self.bridge = EngineBridge(engine, self.metrics, self.config.server.max_inflight_requests + 16)

    def engine(self) -> tuple[EngineBridge, Engine]:
        if self.bridge is None:
            detail = f"model failed to load: {self.load_error}" if self.load_error else "model is still loading"
            raise ApiError(503, detail, None, headers=self.retry_after)
        if self.is_draining:
            raise ApiError(503, "server is shutting down", None, headers=self.retry_after)
        return self.bridge, self.bridge.engine

    async def shutdown(self) -> None:
        """Cancel whatever is still running, then close the engine (its loop thread ends)."""
        self.is_draining = True
        if self.bridge is None:
            return
        bridge, engine = self.bridge, self.bridge.engine
        unfinished = await bridge.run(_cancel_all, engine)
        log.info("shutdown: cancelled %d unfinished request(s)", unfinished)
        await bridge.run(engine.close)
        bridge.close()

    # --- requests ------------------------------------------------------------
    async def submit(self, queries: list[Any], options: dict[str, Any], api: str, listen: bool = False,
                     retained: bool = False) -> Tracked:
        """Hand the questions to the engine; engine errors become HTTP errors naming the field."""
        bridge, _ = self.engine()
        self.sweep()
        if not self.registry.reserve():
            self.metrics.rejects.labels("server_busy").inc()
            raise ApiError(429, f"server busy: {self.registry.num_inflight} requests in flight; the limit is "
                                f"server.max_inflight_requests={self.registry.max_inflight}", None, headers=self.retry_after)
        options = {"max_tokens": self.limits.default_max_tokens, **options}
        try:
            request_id = await bridge.submit(queries, options)
        except InvalidRequestError as err:
            raise ApiError.from_message(422, str(err)) from None
        except RejectedError as err:
            self.metrics.rejects.labels(f"overflow_{self.config.router.overflow_policy}").inc()
            retry = str(getattr(err, "retry_after_s", None) or self.config.server.retry_after_s)
            raise ApiError(429, str(err) or "channel pool is full", None, headers={"Retry-After": retry}) from None
        except TimeoutError as err:  # overflow_policy: wait, and no channel freed up in time
            self.metrics.rejects.labels("wait_timeout").inc()
            raise ApiError(503, str(err) or "no channel became free in time", None, headers=self.retry_after) from None
        finally:
            self.registry.unreserve()
        tracked = Tracked(request_id, bridge.watch(request_id, len(queries), listen), retained)
        self.registry.add(tracked)
        self.metrics.requests.labels(api).inc()
        return tracked

    async def wait(self, tracked: Tracked, http: HttpRequest) -> bool:
        """Until every question finished (True) or the caller hung up (False; its release() then cancels them)."""
        finished = asyncio.ensure_future(tracked.watch.done.wait())
        gone = asyncio.ensure_future(_disconnected(http))
        try:
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished.cancel()
            gone.cancel()
        return tracked.is_done

    async def results(self, request_id: str) -> list[Result]:
        bridge, engine = self.engine()
        return await bridge.run(engine.results, request_id)

    async def cancel(self, tracked: Tracked) -> None:
        bridge, engine = self.engine()
        tracked.cancelled = not tracked.is_done
        await bridge.run(engine.cancel, tracked.request_id)

    def release(self, request_id: str) -> None:
        """The caller is done with it (answered, or gone): cancel what is left and forget it. Never awaits."""
        self.registry.remove(request_id)
        if self.bridge is not None:
            self.bridge.run_soon(self.bridge.engine.forget, request_id)

    def sweep(self) -> None:
        for request_id in self.registry.expired():
            self.release(request_id)

    def tracked(self, request_id: str) -> Tracked:
        self.sweep()
        tracked = self.registry.get(request_id)
        if tracked is None:
            raise ApiError(404, f"request_id: {request_id!r} is unknown (or its results expired)", "request_id")
        return tracked


async def _disconnected(http: HttpRequest) -> None:
    """Returns when the client closes the connection (the body was already read by then)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def _cancel_all(engine: Engine) -> int:
    """Every request the engine still runs, including ones whose caller already left."""
    unfinished = [rid for rid, request in list(engine.requests.items()) if not request.done.is_set()]
    for request_id in unfinished:
        engine.cancel(request_id)
    return len(unfinished)
