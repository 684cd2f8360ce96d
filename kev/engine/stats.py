"""Counters the engine keeps about its own steps (read by /metrics, /v1/channels and the playground)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import astuple, dataclass, field


@dataclass(frozen=True)
class StepRecord:
    at: float  # unix seconds when the step ended
    num_channels: int  # channels in the forward
    num_tokens: int  # tokens computed (prefill + decode)
    num_sampled: int  # tokens generated
    step_ms: float


@dataclass
class EngineStats:
    num_steps: int = 0
    num_tokens_computed: int = 0
    num_tokens_generated: int = 0
    num_prefix_tokens_computed: int = 0  # shared-prefix prefill (≈0 for a repeated prefix under loose)
    recent: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=4096))

    def record(self, num_channels: int, num_tokens: int, num_sampled: int, step_ms: float,
               prefix_tokens: int = 0) -> None:
        self.num_steps += 1
        self.num_prefix_tokens_computed += prefix_tokens
        self.num_tokens_computed += num_tokens
        self.num_tokens_generated += num_sampled
        self.recent.append(StepRecord(time.time(), num_channels, num_tokens, num_sampled, step_ms))


@dataclass(frozen=True)
class EngineLoad:
    """What the engine holds now, and its cumulative prefix-cache counters (read by /metrics and the stats log).

    Engines add up (multi_gpu replicas, distributed workers): a usage ratio is taken of the sums,
    never averaged over engines of different sizes."""

    num_running: int = 0  # questions in a channel (prefill or decode)
    num_waiting: int = 0  # questions in a channel queue or the overflow FIFO
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_queries: int = 0  # loose-level prefix cache lookups since start
    prefix_hits: int = 0  # ... that found the prefix's K/V already computed

    def __add__(self, other: EngineLoad) -> EngineLoad:
        return EngineLoad(*(a + b for a, b in zip(astuple(self), astuple(other))))

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
