"""build_backend: the engine behind the HTTP edge, chosen by deploy.mode, seen through EngineBridge.

single: one Engine; multi_gpu: one engine replica per device (ReplicaEngine); distributed: the
router's link to workers and an aggregator over NATS JetStream (RouterEngine). Each
implements EngineAPI (kev/engine/api.py), which is all the server calls.
"""
from __future__ import annotations

from collections.abc import Callable

from kev.config import KevConfig
from kev.engine.api import EngineAPI
from kev.backend.bridge import EngineBridge
from kev.backend.metrics import ServerMetrics

EngineFactory = Callable[[KevConfig], EngineAPI]  # config -> an Engine (or anything with its API)


def build_backend(config: KevConfig, metrics: ServerMetrics, engine_factory: EngineFactory | None) -> EngineBridge:
    """The backend for config.deploy.mode; runs in a loader thread (it loads models).

    engine_factory replaces the engine of single mode (tests)."""
    max_threads = config.server.max_inflight_requests + 16
    if config.deploy.mode == "distributed":
        from kev.distributed.router_engine import RouterEngine

        router = RouterEngine(config, metrics.registry)
        return EngineBridge(router, metrics, max_threads, readiness=router.link)
    if config.deploy.mode == "multi_gpu" and engine_factory is None:
        from kev.engine.replicas import ReplicaEngine

        return EngineBridge(ReplicaEngine(config), metrics, max_threads)
    if engine_factory is None:
        from kev.engine.engine import Engine

        engine_factory = Engine
    return EngineBridge(engine_factory(config), metrics, max_threads)
