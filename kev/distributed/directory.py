"""WorkerDirectory: the workers heard from lately (their heartbeats), and which partitions are served.

A worker is alive while its last heartbeat is younger than 5 heartbeat periods: on a busy
machine a heartbeat can be late without the worker being gone, and a gone worker's
questions come back by redelivery anyway.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kev.distributed.messages import MalformedMessage, WorkerStatus, decode
from kev.engine.stats import EngineLoad, EngineStats

LIVE_PERIODS = 5


@dataclass
class WorkerDirectory:
    heartbeat_s: float
    workers: dict[str, tuple[float, WorkerStatus]] = field(default_factory=dict)  # id -> (clock(), status)
    # Every worker ever heard from, its latest status: cumulative counters (alerts, prefix cache) add up over
    # these, so a worker that leaves keeps its last count and a cluster-wide counter never goes down.
    seen: dict[str, WorkerStatus] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic  # what ages heartbeats (a test moves its own)

    def on_status(self, data: bytes) -> None:
        try:
            status = decode(WorkerStatus, data)
        except MalformedMessage:
            return
        self.workers[status.worker] = (self.clock(), status)
        self.seen[status.worker] = status

    def live(self) -> list[WorkerStatus]:
        horizon = self.clock() - LIVE_PERIODS * self.heartbeat_s
        for worker in [w for w, (at, _) in self.workers.items() if at < horizon]:
            del self.workers[worker]
        return sorted((s for _, s in self.workers.values()), key=lambda s: s.worker)

    def num_live(self) -> int:
        """How many workers are alive; unlike live(), it changes nothing (safe from another thread)."""
        return len(self.live_names())

    def live_names(self) -> set[str]:
        """The workers alive now; like num_live, it changes nothing."""
        horizon = self.clock() - LIVE_PERIODS * self.heartbeat_s
        return {worker for worker, (at, _) in list(self.workers.items()) if at >= horizon}

    def live_partitions(self) -> set[int] | None:
        """Partitions a live worker pulls; None while no worker is heard from (then every partition
        counts: questions wait in the stream for a worker, within the backlog limits)."""
        return {s.partition for s in self.live()} or None

    def totals(self) -> tuple[EngineStats, dict[str, int]]:
        """The live workers' step counters, and the audit alert counts of every worker heard from, added up."""
        stats, alerts = EngineStats(), dict[str, int]()
        for s in self.live():
            stats.num_steps += s.num_steps
            stats.num_tokens_computed += s.num_tokens_computed
            stats.num_tokens_generated += s.num_tokens_generated
        for s in self.seen.values():
            for kind, n in s.alerts.items():
                alerts[kind] = alerts.get(kind, 0) + n
        return stats, alerts

    def load(self) -> EngineLoad:
        """Running, waiting and KV blocks of the live workers; prefix-cache counters of every worker heard from."""
        live = sum((_load(s) for s in self.live()), EngineLoad())
        ever = sum((_load(s) for s in self.seen.values()), EngineLoad())
        return replace(live, prefix_queries=ever.prefix_queries, prefix_hits=ever.prefix_hits,
                       prefix_by_tenant=ever.prefix_by_tenant)

    def channel_states(self) -> list[dict[str, Any]]:
        """Every live worker's channels; channel_id is the worker's own, `worker` says whose."""
        return [{**channel, "worker": s.worker} for s in self.live() for channel in s.channels]


def _load(status: WorkerStatus) -> EngineLoad:
    """A heartbeat's load (fields an older worker does not send count as 0)."""
    return EngineLoad.from_counts(status.load)
