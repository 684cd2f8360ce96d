"""What `kev serve` logs for operators: the start-up banner, one access line per request, a stats line every 10 s.

Lines go to the "kev.access" and "kev.stats" loggers at INFO; each also carries its figures as
record attributes, which `--log-format json` writes as fields (kev/cli/logs.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kev.engine.describe import banner
from kev.engine.stats import EngineLoad
from kev.backend.bridge import EngineBridge

access_log = logging.getLogger("kev.access")
stats_log = logging.getLogger("kev.stats")
log = logging.getLogger("kev.server")


def log_banner(backend: EngineBridge) -> None:
    try:
        info = backend.describe()
    except Exception as err:  # a banner never stops a server from serving
        log.warning("no start-up banner: %r", err)
        return
    log.info("serving %s", banner(info), extra={"banner": info})


def log_access(request_id: str, api: str, statuses: Counter[str], started: float, cancelled: bool,
               tenant: str = "default") -> None:
    """request id, tenant, API, questions, how many ended in each status, latency from submit to the last answer."""
    latency_ms = (time.monotonic() - started) * 1000
    counts = " ".join(f"{status}={n}" for status, n in sorted(statuses.items()))
    access_log.info("request %s tenant=%s %s questions=%d %s latency_ms=%.0f%s", request_id, tenant, api,
                    sum(statuses.values()), counts, latency_ms, " (caller left: cancelled)" if cancelled else "",
                    extra={"request_id": request_id, "tenant": tenant, "api": api, "questions": sum(statuses.values()),
                           "statuses": dict(statuses), "latency_ms": round(latency_ms, 1)})


LOADING_POLL_S = 0.02


@dataclass
class Throughput:
    """Tokens since the last stats line: prefill tokens (computed minus sampled) and generated tokens."""

    at: float
    computed: int
    generated: int

    def rates(self, now: float, computed: int, generated: int) -> tuple[float, float]:
        seconds = max(now - self.at, 1e-9)
        new_generated = max(0, generated - self.generated)  # a cluster's sum drops when a worker leaves: never < 0
        prompt = max(0, computed - self.computed - new_generated) / seconds
        return prompt, new_generated / seconds


async def report_stats(backend_now: Callable[[], EngineBridge | None], interval_s: float) -> None:
    """Every interval_s while there is work (or tokens moved since the last line): throughput, queue, KV usage."""
    last: Throughput | None = None
    while True:
        try:
            backend = backend_now()
            if backend is None:  # still loading
                raise LookupError("no backend yet")
            stats, load = await backend.stats(), await backend.load()
        except Exception as err:  # a backend going away (shutdown) ends nothing but this line
            log.debug("stats line skipped: %r", err)
            # Still loading: look again soon, so the first counts are read before the first request can finish
            # (a baseline read after it would hide its tokens from every line).
            await asyncio.sleep(min(interval_s, LOADING_POLL_S) if last is None else interval_s)
            continue
        now = time.monotonic()
        if last is None:
            last = Throughput(now, stats.num_tokens_computed, stats.num_tokens_generated)
            await asyncio.sleep(interval_s)
            continue
        prompt, generation = last.rates(now, stats.num_tokens_computed, stats.num_tokens_generated)
        last = Throughput(now, stats.num_tokens_computed, stats.num_tokens_generated)
        if load.num_running or load.num_waiting or prompt or generation:
            stats_log.info(stats_line(prompt, generation, load), extra={
                "prompt_tokens_per_s": round(prompt, 1), "generation_tokens_per_s": round(generation, 1),
                "running": load.num_running, "waiting": load.num_waiting, "kv_usage": round(load.kv_usage, 4)})
        await asyncio.sleep(interval_s)


def stats_line(prompt: float, generation: float, load: EngineLoad) -> str:
    hits = f", prefix cache hit rate {load.prefix_hits / load.prefix_queries:.1%}" if load.prefix_queries else ""
    return (f"prompt throughput {prompt:.1f} tokens/s, generation throughput {generation:.1f} tokens/s, "
            f"running {load.num_running}, waiting {load.num_waiting} questions, KV cache usage {load.kv_usage:.1%} "
            f"({load.kv_blocks_used}/{load.kv_blocks_total} blocks){hits}")
