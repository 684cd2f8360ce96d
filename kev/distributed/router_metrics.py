"""The cluster as the router's /metrics shows it: the work stream's backlog per partition, live workers, NATS.

Each gauge reads the router's own counts when /metrics is scraped (from the server's thread: plain reads)."""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from kev.router.placement import PartitionLoads


def add_cluster_gauges(registry: CollectorRegistry, loads: PartitionLoads, num_workers: Callable[[], int],
                       is_connected: Callable[[], bool]) -> None:
    waiting = Gauge("kev_partition_waiting", "questions in a work partition not yet pulled by a worker",
                    ["partition"], registry=registry)
    running = Gauge("kev_partition_running", "questions pulled from a partition and not yet answered",
                    ["partition"], registry=registry)
    for partition in range(len(loads.waiting)):
        waiting.labels(str(partition)).set_function(_reader(loads, partition, running=False))
        running.labels(str(partition)).set_function(_reader(loads, partition, running=True))
    Gauge("kev_overflow_waiting", "questions in the shared overflow queue (overflow_policy queue)",
          registry=registry).set_function(lambda: loads.overflow)
    Gauge("kev_partition_waiting_peak", "the most questions waiting in the partitions at once since the router started",
          registry=registry).set_function(lambda: loads.peak_waiting)
    Gauge("kev_overflow_waiting_peak", "the most questions in the overflow queue at once since the router started",
          registry=registry).set_function(lambda: loads.peak_overflow)
    Gauge("kev_workers_live", "workers whose heartbeat is recent", registry=registry).set_function(num_workers)
    Gauge("kev_nats_connected", "1 while the router is connected to NATS",
          registry=registry).set_function(lambda: int(is_connected()))


def _reader(loads: PartitionLoads, partition: int, running: bool) -> Callable[[], float]:
    """One partition's count as it is when read (update() replaces the lists)."""
    return lambda: (loads.running if running else loads.waiting)[partition]
