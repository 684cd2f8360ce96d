"""Shared prefixes: a declared system prompt's KV, computed once and handed to many channels.

strict  — the entry is scratch: each channel copies its K/V into private blocks, then
          the entry is released once every question of the request has copied.
shared  — the entry's full blocks become read-only and every channel's table points at
          them (ref counted); a partial last block is copied privately.
loose   — as shared, but the entry outlives its request, so a repeated prefix costs no
          prefill; evicted when blocks run short. A prefix the operator declared public
          (isolation.system_prompt) is one entry for every caller; any other prefix is keyed
          by its tenant, so a caller can never hit, and so never time, another tenant's
          prompt (vLLM's CVE-2025-46570; docs/security.md).

Entry keys are typed: (scope, owner, token hash) with scope "public" (owner ""), "tenant"
(owner: the tenant) or "request" (owner: the request_id; strict and shared, where nothing is
ever reused across requests). Distinct scopes never collide, whatever a tenant is named.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from kev.engine.kv.block_manager import BlockManager


class PrefixKey(NamedTuple):
    scope: Literal["public", "tenant", "request"]
    owner: str  # "" (public), the tenant, or the request_id
    digest: str  # of the prefix's token ids (the entry keeps the ids too: a hash is not proof)


@dataclass
class PrefixEntry:
    key: PrefixKey
    owner_id: int  # negative: its blocks sit in the block manager under this owner
    token_ids: list[int]
    level: str
    ready: bool = False
    waiting: int = 0  # questions that still have to attach
    last_used: float = field(default_factory=time.monotonic)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def prefix_key(level: str, token_ids: list[int], request_id: str, tenant: str, is_public: bool) -> PrefixKey:
    """loose: one entry per public prefix, else one per (tenant, prefix); strict and shared: per request."""
    digest = hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()
    if level != "loose":
        return PrefixKey("request", request_id, digest)
    return PrefixKey("public", "", digest) if is_public else PrefixKey("tenant", tenant, digest)


class PrefixStore:
    def __init__(self, blocks: BlockManager) -> None:
        self.blocks = blocks
        self.entries: dict[PrefixKey, PrefixEntry] = {}
        self._next_owner = -1
        self.num_hits = 0
        # loose lookups (the cross-request prefix cache) and hits, by the tenant that looked: for the operator's
        # /metrics only (a count another tenant could read would tell it when its guess was cached)
        self.loose_counts: dict[str, list[int]] = {}

    @property
    def num_loose_queries(self) -> int:
        return sum(queries for queries, _ in self.loose_counts.values())

    @property
    def num_loose_hits(self) -> int:
        return sum(hits for _, hits in self.loose_counts.values())

    def acquire(self, key: PrefixKey, token_ids: list[int], level: str, tenant: str = "") -> tuple[PrefixEntry, bool]:
        """The entry for key (created if new); True when it must still be computed. tenant: who looks (counters)."""
        entry = self.entries.get(key)
        counts = self.loose_counts.setdefault(tenant, [0, 0]) if level == "loose" else [0, 0]
        counts[0] += 1
        if entry is not None and entry.token_ids == token_ids:  # tokens compared too: a hash is not proof
            entry.waiting += 1
            entry.last_used = time.monotonic()
            self.num_hits += entry.ready
            counts[1] += 1  # found: its K/V are not computed again
            return entry, False
        entry = PrefixEntry(key, self._next_owner, list(token_ids), level, waiting=1)
        self._next_owner -= 1
        self.entries[key] = entry
        return entry, True

    def finish(self, entry: PrefixEntry) -> None:
        """Its K/V are written: full blocks become read-only (they are shared from now on)."""
        entry.ready = True
        table = self.blocks.block_table(entry.owner_id)
        self.blocks.mark_read_only(table)

    def shared_blocks(self, entry: PrefixEntry) -> list[int]:
        """The entry's blocks fully covered by the prefix (a partial last block is never shared)."""
        full = entry.num_tokens // self.blocks.block_size
        return self.blocks.block_table(entry.owner_id)[:full]

    def detach(self, entry: PrefixEntry) -> None:
        """A question has its copy or its references; drop the entry when nobody else needs it."""
        entry.waiting -= 1
        if entry.waiting <= 0 and entry.level != "loose":
            self.drop(entry)

    def drop(self, entry: PrefixEntry) -> None:
        self.entries.pop(entry.key, None)
        self.blocks.release(entry.owner_id)

    def evict(self, blocks_needed: int) -> bool:
        """Free unused loose entries, least recently used first, until blocks_needed are free."""
        idle = sorted((e for e in self.entries.values() if e.ready and e.waiting <= 0), key=lambda e: e.last_used)
        for entry in idle:
            if self.blocks.num_free_blocks >= blocks_needed:
                break
            self.drop(entry)
        return self.blocks.num_free_blocks >= blocks_needed
