"""KevService: what every route shares: the backend (once loaded), limits, registry, metrics.

Routes stay thin: they validate, call submit() / wait() / results() / release(), and format.
The backend is an EngineBridge over the engine of deploy.mode (an Engine, replicas or a cluster); see
kev/backend/factory.py.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.requests import Request as HttpRequest

from kev.results.result import Result
from kev.config import KevConfig
from kev.engine.sampling_params import SamplingParams
from kev.errors import InvalidRequestError, RejectedError, UnavailableError, UnknownRequestError
from kev.model.tokenizer import Tokenizer
from kev.backend.bridge import EngineBridge
from kev.wire.bodies.errors import ApiError
from kev.wire.engine_call import Served, ToolSetup, served_model_name
from kev.wire.limits import Limits
from kev.backend.metrics import ServerMetrics
from kev.server.oplog import log_access, log_banner
from kev.server.registry import RequestRegistry, Tracked
from kev.config.tenants import Tenants

log = logging.getLogger("kev.server")


class KevService:
    def __init__(self, config: KevConfig, metrics: ServerMetrics, tenants: Tenants | None = None) -> None:
        self.config, self.metrics = config, metrics
        self.tenants = tenants or Tenants({})
        self.limits = Limits.from_config(config)
        server = config.server
        share, names = config.sharing, self.tenants.tenant_names
        inflight, retained = server.max_inflight_requests, server.max_retained_results
        self.registry = RequestRegistry(
            inflight, server.result_ttl_s, retained,
            lambda t: share.tenant_limit(share.tenant_max_inflight_requests, inflight, t, names),
            lambda t: share.tenant_limit(share.tenant_max_retained_results, retained, t, names))
        self.model_name = served_model_name(config)
        self.retry_after = {"Retry-After": str(server.retry_after_s)}
        self.backend: EngineBridge | None = None
        self.load_error: str | None = None
        self.is_draining = False
        self.started_at = time.time()

    # --- life ----------------------------------------------------------------
    def attach(self, backend: EngineBridge) -> None:
        """On the event loop, once the backend is loaded: log the banner."""
        self.backend = backend
        log_banner(backend)

    @property
    def is_ready(self) -> bool:
        return self.backend is not None and not self.is_draining and self.not_ready_because() is None

    def not_ready_because(self) -> str | None:
        """Why the loaded backend is not ready: it refuses work, or a service on the request path is down."""
        if self.backend is None:
            return None
        return self.backend.unavailable or self.backend.degraded

    def ready_backend(self) -> EngineBridge:
        """The backend for new work, or a 503 (with Retry-After) saying why there is none to use now."""
        backend = self.loaded_backend()
        if self.is_draining:
            raise ApiError(503, "server is shutting down", None, headers=self.retry_after)
        return backend

    def loaded_backend(self) -> EngineBridge:
        """The backend for work already accepted (it stays readable while the server drains)."""
        if self.backend is None:
            detail = f"model failed to load: {self.load_error}" if self.load_error else "model is still loading"
            raise ApiError(503, detail, None, headers=self.retry_after)
        return self.backend

    @property
    def is_loading(self) -> bool:
        return self.backend is None and self.load_error is None

    async def cancel_unfinished(self) -> None:
        """Draining, the grace period is over: every unfinished question ends as cancelled, and each caller
        still gets its answer (JSON results / a final SSE event per question with status cancelled)."""
        self.is_draining = True
        if self.backend is not None:
            unfinished = await self.backend.cancel_unfinished()
            log.info("shutdown: cancelled %d unfinished request(s)", unfinished)

    async def shutdown(self) -> None:
        """Cancel whatever is still running, then let the backend go (an engine's loop thread ends)."""
        self.is_draining = True
        if self.backend is None:
            return
        unfinished = await self.backend.shutdown()
        if unfinished:
            log.info("shutdown: cancelled %d unfinished request(s)", unfinished)

    # --- requests ------------------------------------------------------------
    async def submit(self, queries: list[Any], sampling: SamplingParams, options: dict[str, Any], api: str,
                     listen: bool = False, retained: bool = False, *, tenant: str) -> Tracked:
        """Hand the tenant's questions to the engine; engine errors become HTTP errors naming the field."""
        backend = self.ready_backend()
        if backend.unavailable is not None:
            self.metrics.rejects.labels("unavailable").inc()
            raise ApiError(503, backend.unavailable, None, headers=self.retry_after)
        self.sweep()
        if (full := self.registry.full(tenant)) is not None or not self.registry.reserve(tenant):
            self.metrics.rejects.labels("server_busy").inc()
            raise ApiError(429, f"server busy: {self.registry.inflight_of(tenant)} of this tenant's requests in "
                                f"flight ({self.registry.num_inflight} in all); the limit is {full}", None,
                           headers=self.retry_after)
        sampling = self.limits.with_default_max_tokens(sampling)
        options = {**options, "tenant": tenant}
        started = time.monotonic()
        try:
            request_id = await backend.submit(queries, sampling, options)
        except UnavailableError as err:
            self.metrics.rejects.labels("unavailable").inc()
            raise ApiError(503, str(err), None, headers=self.retry_after) from None
        except InvalidRequestError as err:
            raise ApiError.from_message(422, str(err)) from None
        except RejectedError as err:
            self.metrics.rejects.labels(f"overflow_{self.config.router.overflow_policy}").inc()
            retry = str(err.retry_after_s or self.config.server.retry_after_s)
            raise ApiError(429, str(err) or "channel pool is full", None, headers={"Retry-After": retry}) from None
        except TimeoutError as err:  # overflow_policy: wait, and no channel freed up in time
            self.metrics.rejects.labels("wait_timeout").inc()
            raise ApiError(503, str(err) or "no channel became free in time", None, headers=self.retry_after) from None
        finally:
            self.registry.unreserve(tenant)
        for query in queries:  # vLLM's request_max_num_generation_tokens: what each question asked for
            own = query.get("max_tokens") if isinstance(query, dict) else None
            self.metrics.vllm.observe_asked(own if isinstance(own, int) else sampling.token_limit)
        tracked = Tracked(request_id, backend.watch(request_id, len(queries), listen), retained, tenant)
        if self.config.server.access_log:  # set before the loop runs again, so before the watch can finish
            tracked.watch.on_finish = lambda watch: log_access(request_id, api, watch.statuses, started,
                                                               tracked.cancelled, tenant)
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

    def tokenizer(self) -> Tokenizer:
        """The served model's tokenizer (503 while loading)."""
        return self.ready_backend().tokenizer

    def decode(self, token_ids: list[int]) -> str:
        """Token ids as the text they stand for, special tokens included (an echoed prompt)."""
        return self.tokenizer().decode(token_ids, skip_special_tokens=False)

    def served(self) -> Served:
        """What an OpenAI body is checked against and how its tools are rendered (kev/wire/engine_call.py)."""
        tools = ToolSetup(self.tokenizer, self.config.server.tool_call_parser, self.config.isolation.system_prompt)
        return Served(self.model_name, self.limits, tools)

    async def answered(self, tracked: Tracked, http: HttpRequest) -> list[Result] | None:
        """Wait for every answer, then release the request: its results, or None when the caller hung up."""
        try:
            if not await self.wait(tracked, http):
                return None
            return await self.results(tracked.request_id)
        finally:
            self.release(tracked.request_id)

    async def results(self, request_id: str) -> list[Result]:
        return await self.loaded_backend().results(request_id)

    async def cancel(self, tracked: Tracked) -> None:
        backend = self.loaded_backend()
        tracked.cancelled = not tracked.is_done
        try:
            await backend.cancel(tracked.request_id)
        except UnknownRequestError:  # it ended and was forgotten meanwhile (a stream that just closed): nothing left
            pass

    async def results_of(self, tracked: Tracked) -> list[Result]:
        """Its results now; those its watch saw, once the engine has forgotten it (answered while we looked)."""
        try:
            return await self.results(tracked.request_id)
        except UnknownRequestError:
            return sorted(tracked.watch.results, key=lambda r: r.index)

    def release(self, request_id: str) -> None:
        """The caller is done with it (answered, or gone): cancel what is left and forget it. Never awaits."""
        self.registry.remove(request_id)
        if self.backend is not None:
            self.backend.forget(request_id)

    def sweep(self) -> None:
        for request_id in self.registry.expired():
            self.release(request_id)

    def tracked(self, request_id: str, tenant: str) -> Tracked:
        """The tenant's request by id (the OpenAI routes' chatcmpl- / cmpl- ids too); another tenant's is a 404,
        as an unknown one: its existence is not revealed."""
        self.sweep()
        tracked = self.registry.get(request_id.removeprefix("chatcmpl-").removeprefix("cmpl-"))
        if tracked is None or tracked.tenant != tenant:
            raise ApiError(404, f"request_id: {request_id!r} is unknown (or its results expired)", "request_id")
        return tracked


async def _disconnected(http: HttpRequest) -> None:
    """Returns when the client closes the connection (the body was already read by then)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass

