"""Counters the engine keeps about its own steps (read by /metrics, /v1/channels and the playground)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, fields


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
    # tenant -> (lookups, hits) of the tenant's requests: the operator's view only (docs/security.md)
    prefix_by_tenant: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Prompt-lookup drafts since start (vLLM's spec-decode counters): verify steps, tokens drafted, tokens accepted.
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    def __add__(self, other: EngineLoad) -> EngineLoad:
        tenants = dict(self.prefix_by_tenant)
        for tenant, (queries, hits) in other.prefix_by_tenant.items():
            mine = tenants.get(tenant, (0, 0))
            tenants[tenant] = (mine[0] + queries, mine[1] + hits)
        return EngineLoad(**{f: getattr(self, f) + getattr(other, f) for f in _COUNTS}, prefix_by_tenant=tenants)

    def to_counts(self) -> dict[str, int]:
        """Flat, for a worker's heartbeat: the per-tenant pairs as prefix_queries:TENANT / prefix_hits:TENANT."""
        counts = {f: getattr(self, f) for f in _COUNTS}
        for tenant, (queries, hits) in self.prefix_by_tenant.items():
            counts[f"prefix_queries:{tenant}"], counts[f"prefix_hits:{tenant}"] = queries, hits
        return counts

    @classmethod
    def from_counts(cls, counts: dict[str, int]) -> EngineLoad:
        """The inverse of to_counts (a field an older worker does not send counts as 0)."""
        tenants = {key.partition(":")[2]: (int(n), int(counts.get("prefix_hits:" + key.partition(":")[2], 0)))
                   for key, n in counts.items() if key.startswith("prefix_queries:")}
        return cls(**{f: int(counts.get(f, 0)) for f in _COUNTS}, prefix_by_tenant=tenants)

    @property
    def acceptance_rate(self) -> float:
        """Drafted tokens the model sampled itself, of all drafted (0 when none was drafted)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


_COUNTS = tuple(f.name for f in fields(EngineLoad) if f.type in ("int", int))
