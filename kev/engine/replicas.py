"""ReplicaEngine: deploy.mode multi_gpu: one engine replica per device (deploy.devices), in this process.

It implements EngineAPI, so `kev serve` and the library use it as they use an Engine. A request's
questions are placed on replicas by the router's strategy over replicas (placement.py; the
breaker and spill read each replica's queue), each replica gets its share as one request
and packs it into its own forwards. One subscription per replica to its event stream maps
the events back to the caller's request and indexes (no thread per request). Replicas on the
same device share one copy of the weights (read-only). Under core.tensor_parallel N, a replica is a group
of N consecutive deploy.devices, its model split over them (kev/engine/tp_runner.py).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace
from typing import Any

from kev.results.ordering import order_results
from kev.results.result import Result
from kev.config import KevConfig
from kev.router.placement import PartitionPlacer
from kev.engine.embedder import MeanEmbedder
from kev.engine.engine import Engine
from kev.engine.engine_setup import build_parts, load_model_and_tokenizer
from kev.engine.events import EventRouter
from kev.engine.request import EventListener, Request, StreamEvent
from kev.engine.request_front import RequestFront
from kev.engine.stats import EngineLoad, StepRecord
from kev.engine.sampling_params import SamplingParams, split_submit
from kev.engine.submission import new_request_id
from kev.errors import InvalidRequestError
from kev.router.features import QuestionFeatures


@dataclass
class Share:
    """The part of a request one replica runs: its request there, and which caller index each of its questions is."""

    replica: int
    request_id: str
    indexes: list[int]


class ReplicaStats:
    """The replicas' EngineStats, added up (what /v1/stats and /metrics read)."""

    def __init__(self, replicas: list[Engine]) -> None:
        self.replicas = replicas

    @property
    def recent(self) -> list[StepRecord]:
        return sorted((r for e in self.replicas for r in list(e.stats.recent)), key=lambda r: r.at)

    @property
    def num_steps(self) -> int:
        return sum(e.stats.num_steps for e in self.replicas)

    @property
    def num_tokens_computed(self) -> int:
        return sum(e.stats.num_tokens_computed for e in self.replicas)

    @property
    def num_tokens_generated(self) -> int:
        return sum(e.stats.num_tokens_generated for e in self.replicas)


class ReplicaEngine(RequestFront[Request]):
    def __init__(self, config: KevConfig) -> None:
        self.config = config
        size = config.core.tensor_parallel
        groups = [list(config.deploy.devices[i:i + size]) for i in range(0, len(config.deploy.devices), size)]
        self.devices = ["+".join(group) for group in groups]  # a replica's devices, as results name them
        self.replicas: list[Engine] = []
        loaded: dict[str, Any] = {}  # device -> (model, tokenizer): one copy of the weights per device
        for group in groups:
            device = group[0]
            replica_config = config.model_copy(update={"core": config.core.model_copy(update={"device": device})})
            if device not in loaded:
                loaded[device] = load_model_and_tokenizer(replica_config)
            model, tokenizer = loaded[device]
            tp_devices = group if size > 1 else None
            self.replicas.append(Engine(replica_config, build_parts(replica_config, model, tokenizer, tp_devices)))
        first = self.replicas[0]
        self.tokenizer = first.tokenizer
        encoder = MeanEmbedder(first.runner.model.embed_tokens.full_weight(), first.tokenizer)
        self.placer = PartitionPlacer.build(config.router, len(self.replicas), encoder)
        self.requests: dict[str, Request] = {}  # the caller's view, fed by the replicas' event streams
        self.shares: dict[str, list[Share]] = {}
        self.priorities: dict[str, dict[int, int]] = {}  # request_id -> index -> priority (aggregator.mode priority)
        self.stats = ReplicaStats(self.replicas)
        self.listeners: list[EventListener] = []
        self.routers = [EventRouter() for _ in self.replicas]
        for replica, router in zip(self.replicas, self.routers):
            replica.subscribe(router)
        self._lock = threading.Lock()  # placement reads and bumps the replicas' loads
        # Delivery runs on a replica's thread with that replica's lock held: its own lock, never held while
        # calling into a replica, so the two cannot wait on each other.
        self._deliver_lock = threading.Lock()

    # --- the Engine API ------------------------------------------------------------
    def submit(self, queries: list[Any], sampling: SamplingParams | None = None, **options: Any) -> str:
        sampling, options = split_submit(sampling, options)
        if not isinstance(queries, (list, tuple)) or not queries:
            raise InvalidRequestError("queries: must be a non-empty list")
        by_replica = self._place(list(queries))
        request_id = new_request_id()
        shares: list[Share] = []
        try:
            for replica, indexes in by_replica.items():
                sub_id = self.replicas[replica].submit([queries[i] for i in indexes], sampling, **options)
                shares.append(Share(replica, sub_id, indexes))
        except BaseException:
            for share in shares:
                self.replicas[share.replica].forget(share.request_id)
                self.routers[share.replica].drop(share.request_id)
            raise
        request = Request(request_id, len(queries), options.get("isolation") or self.config.isolation.level)
        self.requests[request_id], self.shares[request_id] = request, shares
        self.priorities[request_id] = {i: _priority(raw) for i, raw in enumerate(queries)}
        for share in shares:
            self.routers[share.replica].route(share.request_id, functools.partial(self._on_event, request, share))
        return request_id

    def _place(self, queries: list[Any]) -> dict[int, list[int]]:
        """Replica per question: the strategy's pick, the breaker's spill; the least loaded when none has room
        (that replica's own overflow_policy then decides, as in single mode)."""
        with self._lock:
            engines = self.replicas
            self.placer.loads.update([e.queue_length() for e in engines], [e.load().num_running for e in engines], 0)
            by_replica: dict[int, list[int]] = {}
            for index, raw in enumerate(queries):
                placement = self.placer.place(self._features(raw))
                replica = placement.channel_id if placement else min(range(len(engines)), key=self.placer.loads.load)
                if placement is None:
                    self.placer.loads.count(replica, 1)
                by_replica.setdefault(replica, []).append(index)
            return by_replica

    def _features(self, raw: Any) -> QuestionFeatures:
        """What placement routes on: the question's (normalized) text and its length in tokens (no chat template)."""
        text = _text_of(raw)
        if not (isinstance(raw, dict) and "prompt" in raw):
            text = self.placer.router.normalizer.normalize(text)
        return self.placer.router.describe(text, len(self.tokenizer.encode(text)))

    def _on_event(self, request: Request, share: Share, event: StreamEvent) -> None:
        """A replica's event of one share, on that replica's thread: the caller's request and index."""
        if event.result is None:
            request.publish(replace(event, index=share.indexes[event.index], request_id=request.request_id),
                            self.listeners)
        else:
            self._deliver(request, share, event.result)

    def _deliver(self, request: Request, share: Share, result: Result) -> None:
        with self._deliver_lock:
            index = share.indexes[result.index]
            if index in request.results:
                return
            # A copy: the replica's own request keeps its result.
            result = replace(result, request_id=request.request_id, index=index,
                             worker=f"replica{share.replica}:{self.devices[share.replica]}")
            request.add_result(result, self.listeners)

    def subscribe(self, listener: EventListener) -> None:
        self.listeners.append(listener)

    def unsubscribe(self, listener: EventListener) -> None:
        self.listeners.remove(listener)

    def alert_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for replica in self.replicas:
            for kind, n in replica.alert_counts().items():
                counts[kind] = counts.get(kind, 0) + n
        return counts

    def cancel_unfinished(self) -> int:
        unfinished = [rid for rid, request in list(self.requests.items()) if not request.done.is_set()]
        for request_id in unfinished:
            self.cancel(request_id)
        return len(unfinished)

    def _ordered(self, request: Request) -> list[Result]:
        return order_results(list(request.results.values()), self.config.aggregator.mode,
                             self.priorities[request.request_id])

    def cancel(self, request_id: str) -> None:
        """Cancel every share; their cancelled results are in before this returns, as with one engine."""
        request = self._request(request_id)
        for share in self.shares.get(request_id, []):
            replica = self.replicas[share.replica]
            replica.cancel(share.request_id)
            for result in replica.results(share.request_id):
                self._deliver(request, share, result)

    def forget(self, request_id: str) -> None:
        for share in self.shares.pop(request_id, []):
            self.replicas[share.replica].forget(share.request_id)
            self.routers[share.replica].drop(share.request_id)
        self.requests.pop(request_id, None)
        self.priorities.pop(request_id, None)

    def channel_states(self) -> list[dict[str, Any]]:
        return [{**state, "worker": f"replica{i}:{self.devices[i]}"}
                for i, replica in enumerate(self.replicas) for state in replica.channel_states()]

    def queue_length(self) -> int:
        return sum(replica.queue_length() for replica in self.replicas)

    def describe(self) -> dict[str, Any]:
        first = self.replicas[0].describe()
        kv = {k: sum(r.describe()[k] for r in self.replicas) for k in ("kv_blocks", "kv_tokens", "kv_bytes")}
        return {**first, **kv, "device": ",".join(self.devices), "replicas": len(self.replicas),
                "max_parallel": first["max_parallel"] * len(self.replicas)}

    def load(self) -> EngineLoad:
        return sum((replica.load() for replica in self.replicas), EngineLoad())

    @property
    def failure(self) -> str | None:
        """Why a replica stopped for good (a tensor-parallel rank died), or None."""
        return next((f"replica {i}: {r.failure}" for i, r in enumerate(self.replicas) if r.failure), None)

    @property
    def num_steps(self) -> int:
        return sum(replica.num_steps for replica in self.replicas)

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()


def _text_of(raw: Any) -> str:
    if isinstance(raw, dict):
        raw = raw.get("text") or raw.get("prompt") or raw.get("messages") or ""
    if isinstance(raw, list):
        last = raw[-1] if raw else {}
        raw = last.get("content", "") if isinstance(last, dict) else ""
    return raw if isinstance(raw, str) else ""


def _priority(raw: Any) -> int:
    """A question's priority as submit() reads it (a dict's own `priority`; 0 otherwise)."""
    priority = raw.get("priority", 0) if isinstance(raw, dict) else 0
    return priority if isinstance(priority, int) else 0
