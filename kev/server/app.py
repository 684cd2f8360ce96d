"""build_app(config): the FastAPI application of `kev serve`.

Behind it is a backend chosen by deploy.mode (kev/backend/factory.py): one engine (single),
one engine per device (multi_gpu), or the router's link to a cluster (distributed). It
loads in a thread after the server starts listening, so /healthz answers at once and
/readyz turns 200 when it is ready; routes that need it answer 503 until then. On shutdown
(after uvicorn's grace period) whatever still runs is cancelled and the backend let go.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

import kev
from kev.config import KevConfig
from kev.batch.server_batches import BatchManager
from kev.batch.store import BatchStore
from kev.errors import EngineFailedError, KevError
from kev.model.tokenizer import Tokenizer
from kev.server import routes_batch, routes_kev, routes_ops, routes_openai, routes_responses, routes_tokenizer
from kev.wire.responses.store import MAX_STORED, ResponseStore
from kev.backend.factory import EngineFactory, build_backend
from kev.server.errors import install_handlers
from kev.backend.metrics import ServerMetrics
from kev.server.middleware import GateMiddleware, HttpMetricsMiddleware
from kev.server.oplog import report_stats
from kev.server.playground import routes as playground
from kev.server.schema_limits import Vocab, apply_limits, served_vocab
from kev.server.service import KevService
from kev.wire.engine_call import served_model_name
from kev.config.tenants import Tenants, open_server_notices

log = logging.getLogger("kev.server")


def build_app(config: KevConfig, api_key: str | None = None, engine_factory: EngineFactory | None = None,
              on_load_failed: Callable[[Exception], None] | None = None, *, api_key_source: str = "--api-key",
              no_auth: bool = False) -> FastAPI:
    """api_key overrides config.server.api_key (tenant "default"; docs/security.md); on_load_failed lets the CLI stop
    the server if the model cannot load (or the engine fails for good later: a tensor-parallel rank died).

    engine_factory replaces the engine of single mode (tests); None: the backend of config.deploy.mode."""
    metrics = ServerMetrics(served_model_name(config), config.core.device)
    # a key that cannot be read, or is empty, stops the start here
    tenants = Tenants.from_config(config.server, api_key, api_key_source, no_auth)
    for line in open_server_notices(tenants, config.server, no_auth):
        (log.warning if line.startswith("WARNING") else log.info)(line.removeprefix("WARNING: "))
    service = KevService(config, metrics, tenants)
    batches = BatchManager(service, BatchStore(config.batch.dir))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loader = threading.Thread(target=_load, name="kev-load", daemon=True,
                                  args=(service, engine_factory, asyncio.get_running_loop(), on_load_failed))
        loader.start()
        batches.start()  # unfinished batches of an earlier run go on once the model is ready
        interval = config.server.stats_interval_s
        stats = asyncio.ensure_future(report_stats(lambda: service.backend, interval)) if interval > 0 else None
        watch = asyncio.ensure_future(_stop_on_failure(service, on_load_failed))
        yield
        watch.cancel()
        if stats is not None:
            stats.cancel()
        await batches.shutdown()  # first: what they cut short is not written, and the next start resumes it
        await service.shutdown()

    app = FastAPI(title="Kev", version=kev.__version__, lifespan=lifespan,
                  description="Many independent questions, one forward pass, isolated channels.")
    app.state.service = service
    app.state.batches = batches
    share = config.sharing  # each tenant's share of the stored responses, as of retained results (service.py)
    app.state.responses = ResponseStore(
        MAX_STORED, lambda t: share.tenant_limit(None, MAX_STORED, t, tenants.tenant_names))
    install_handlers(app)
    for router in (routes_kev.router, routes_openai.router, routes_responses.router, routes_tokenizer.router,
                   routes_batch.router,
                   routes_ops.router, playground.router):
        app.include_router(router)
    _document_served_model(app, service, config.isolation.level)
    # An uploaded file may be as large as batch.max_file_bytes; the route checks its exact size.
    app.add_middleware(GateMiddleware, tenants=tenants,
                       max_body_bytes=config.server.max_body_bytes, body_timeout_s=config.server.body_timeout_s,
                       path_limits={"/v1/files": (config.batch.max_file_bytes, "batch.max_file_bytes")})
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)  # outermost: counts the gate's refusals too
    return app


def _document_served_model(app: FastAPI, service: KevService, isolation_cap: str) -> None:
    """The OpenAI routes accept one model name; say which in the schema (FastAPI's documented override), with
    the server's limits (schema_limits). Once the model has loaded, the schema is made once more with its
    vocabulary (the token ids the OpenAI routes and /detokenize take)."""
    generate = app.openapi
    with_vocab = False

    def openapi() -> dict[str, Any]:
        nonlocal with_vocab
        loaded = service.backend
        if app.openapi_schema is None or (loaded is not None and not with_vocab):
            vocab = None if loaded is None else _vocab(service.config, loaded.tokenizer)
            with_vocab = loaded is not None
            app.openapi_schema = None
            schemas = generate()["components"]["schemas"]
            for body in ("ChatCompletionBody", "CompletionBody"):
                schemas[body]["properties"]["model"]["enum"] = [service.model_name]
            apply_limits(app.openapi_schema, service.limits, isolation_cap, vocab)  # type: ignore[arg-type]  # generate() has filled it
        return app.openapi_schema  # type: ignore[return-value]  # generate() above has filled it

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to adjust the schema


def _vocab(config: KevConfig, tokenizer: Tokenizer) -> Vocab | None:
    try:
        return served_vocab(config.core.model_path, tokenizer)
    except (KevError, OSError, ValueError) as err:  # a test's engine without a model folder: ids stay unbounded
        log.warning("the OpenAPI schema leaves token ids unbounded: %s", err)
        return None


async def _stop_on_failure(service: KevService, on_failed: Callable[[Exception], None] | None) -> None:
    """A backend that fails for good (a tensor-parallel rank died) stops the server, which then exits non-zero;
    meanwhile /health answers 503 with the reason."""
    while (backend := service.backend) is None or backend.failure is None:
        await asyncio.sleep(0.5)
    log.error("the engine failed: %s", backend.failure)
    service.load_error = backend.failure
    if on_failed is not None:
        on_failed(EngineFailedError(backend.failure))


def _load(service: KevService, factory: EngineFactory | None, loop: asyncio.AbstractEventLoop,
          on_load_failed: Callable[[Exception], None] | None) -> None:
    try:
        backend = build_backend(service.config, service.metrics, factory)
    except Exception as err:
        if isinstance(err, KevError):  # a model or config Kev cannot run: one line naming it, no traceback
            log.error("model failed to load: %s", err)
        else:
            log.exception("model failed to load")
        service.load_error = f"{type(err).__name__}: {err}"
        if on_load_failed is not None:
            loop.call_soon_threadsafe(on_load_failed, err)
        return
    try:
        loop.call_soon_threadsafe(service.attach, backend)
    except RuntimeError:  # the server stopped while the model loaded
        asyncio.run(backend.shutdown())
        return
    log.info("model %s loaded; ready", service.model_name)
