"""The cluster as the router's /metrics shows it: the work stream's backlog per partition, live workers, NATS."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from kev.distributed.placement import PartitionLoads


class ClusterGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.waiting = Gauge("kev_partition_waiting", "questions in a work partition not yet pulled by a worker",
                             ["partition"], registry=registry)
        self.running = Gauge("kev_partition_running", "questions pulled from a partition and not yet answered",
                             ["partition"], registry=registry)
        self.overflow = Gauge("kev_overflow_waiting", "questions in the shared overflow queue (overflow_policy queue)",
                              registry=registry)
        self.workers = Gauge("kev_workers_live", "workers whose heartbeat is recent", registry=registry)
        self.connected = Gauge("kev_nats_connected", "1 while the router is connected to NATS", registry=registry)

    def set(self, loads: PartitionLoads, num_workers: int, connected: bool) -> None:
        for partition, (waiting, running) in enumerate(zip(loads.waiting, loads.running)):
            self.waiting.labels(str(partition)).set(waiting)
            self.running.labels(str(partition)).set(running)
        self.overflow.set(loads.overflow)
        self.workers.set(num_workers)
        self.connected.set(1 if connected else 0)
