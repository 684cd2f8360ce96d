"""The backend a `kev batch` job runs on: an engine in this process, replicas, or a cluster (deploy.mode)."""
from __future__ import annotations

import asyncio
import time

from kev.config import KevConfig
from kev.errors import UnavailableError
from kev.backend.factory import build_backend
from kev.backend.bridge import EngineBridge
from kev.backend.metrics import ServerMetrics

CONNECT_TIMEOUT_S = 60.0


async def open_backend(config: KevConfig) -> EngineBridge:
    """Loads the model (or, distributed, the router's tokenizer) and connects; the same seam `kev serve` uses."""
    backend = await asyncio.to_thread(build_backend, config, ServerMetrics(), None)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while backend.unavailable is not None:  # distributed: until the link to NATS is up
        if time.monotonic() > deadline:
            await backend.shutdown()
            raise UnavailableError(f"the cluster is unavailable: {backend.unavailable} (deploy.nats_url="
                                   f"{config.deploy.nats_url})")
        await asyncio.sleep(0.1)
    return backend


async def close_backend(backend: EngineBridge) -> None:
    """Cancel what is left and let the backend go."""
    await backend.shutdown()


def default_max_inflight(config: KevConfig) -> int:
    """batch.max_inflight, else twice what the engines hold without overflow: router.channel_pool_size x
    (1 + router.channel_queue_depth) per engine. Every channel busy, and as many again ready to bind the moment
    one frees (as if everything had been submitted at once); one request per channel measured ~12% slower."""
    if config.batch.max_inflight is not None:
        return config.batch.max_inflight
    deploy = config.deploy
    engines = {"multi_gpu": len(deploy.devices), "distributed": deploy.num_partitions}.get(deploy.mode, 1)
    return 2 * config.router.channel_pool_size * (1 + config.router.channel_queue_depth) * max(engines, 1)
