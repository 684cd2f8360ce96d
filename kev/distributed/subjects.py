"""Names of everything a Kev cluster keeps in NATS, derived from deploy.subject_prefix (default "kev").

Streams (JetStream):
  {P}_WORK     work queue (retention: work queue, file storage). One question per message, on
               {p}.work.p<N> (partition N: the router's strategy picks it) or {p}.work.any (the
               overflow queue of policy `queue`, which every worker drains). One durable pull
               consumer per subject, {P}_p<N> / {P}_any, shared by the workers that pull it.
  {P}_RESULTS  final answers from the workers on {p}.result.<request_id> (limits retention, TTL);
               one durable pull consumer, {P}_aggregator, shared by the aggregators.
  {P}_DEAD     dead letters on {p}.dead.<kind>: a message nobody could read, with the reason.
KV buckets (JetStream):
  {p}_requests  request_id -> RequestRecord (deadlines and metadata): written by the router,
                watched by the aggregator, so a restarted aggregator finds every open request.
  {p}_answers   "<request_id>.<index>" -> the accepted answer. Created, never overwritten: the
                first create wins, which is what makes every question answered exactly once.
Core subjects (no persistence; a lost one is recovered from the answers bucket):
  {p}.delta.<request_id>  streaming deltas, worker -> aggregator
  {p}.out.<router_id>     accepted answers and relayed deltas, aggregator -> router
  {p}.cancel              cancelled request ids, router -> workers
  {p}.status.<worker_id>  worker heartbeats (capacity, channels), worker -> routers
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    prefix: str
    num_partitions: int

    # --- streams and consumers --------------------------------------------------
    @property
    def work_stream(self) -> str:
        return f"{self.prefix.upper()}_WORK"

    @property
    def results_stream(self) -> str:
        return f"{self.prefix.upper()}_RESULTS"

    @property
    def dead_stream(self) -> str:
        return f"{self.prefix.upper()}_DEAD"

    def partition_subject(self, partition: int) -> str:
        return f"{self.prefix}.work.p{partition}"

    @property
    def overflow_subject(self) -> str:
        return f"{self.prefix}.work.any"

    def partition_consumer(self, partition: int) -> str:
        return f"{self.prefix.upper()}_p{partition}"

    @property
    def overflow_consumer(self) -> str:
        return f"{self.prefix.upper()}_any"

    @property
    def aggregator_consumer(self) -> str:
        return f"{self.prefix.upper()}_aggregator"

    def work_consumers(self) -> list[tuple[str, str]]:
        """(durable name, subject) of every work consumer: the partitions, then the overflow queue."""
        return [(self.partition_consumer(p), self.partition_subject(p)) for p in range(self.num_partitions)] + [
            (self.overflow_consumer, self.overflow_subject)]

    # --- subjects ---------------------------------------------------------------
    def result_subject(self, request_id: str) -> str:
        return f"{self.prefix}.result.{request_id}"

    def dead_subject(self, kind: str) -> str:
        return f"{self.prefix}.dead.{kind}"

    def delta_subject(self, request_id: str) -> str:
        return f"{self.prefix}.delta.{request_id}"

    def out_subject(self, router_id: str) -> str:
        return f"{self.prefix}.out.{router_id}"

    @property
    def cancel_subject(self) -> str:
        return f"{self.prefix}.cancel"

    def status_subject(self, worker_id: str) -> str:
        return f"{self.prefix}.status.{worker_id}"

    # --- KV buckets -------------------------------------------------------------
    @property
    def requests_bucket(self) -> str:
        return f"{self.prefix}_requests"

    @property
    def answers_bucket(self) -> str:
        return f"{self.prefix}_answers"


def answer_key(request_id: str, index: int) -> str:
    return f"{request_id}.{index}"
