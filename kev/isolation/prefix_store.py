"""Shared prefixes: a declared system prompt's KV, computed once and handed to many channels.

strict  — the entry is scratch: each channel copies its K/V into private blocks, then
          the entry is released once every question of the request has copied.
shared  — the entry's full blocks become read-only and every channel's table points at
          them (ref counted); a partial last block is copied privately.
loose   — as shared, but the entry outlives its request, keyed by (tenant, token hash),
          so a repeated public prefix costs no prefill; evicted when blocks run short.

Entry keys are typed tuples: (scope, tenant or request_id, token hash). strict and shared
entries are scoped to one request, so nothing is ever reused across requests there.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from kev.isolation.block_manager import BlockManager

PrefixKey = tuple[str, str, str]


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


def prefix_key(level: str, token_ids: list[int], request_id: str, tenant: str) -> PrefixKey:
    digest = hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:24]
    return ("loose", tenant, digest) if level == "loose" else (level, request_id, digest)


class PrefixStore:
    def __init__(self, blocks: BlockManager) -> None:
        self.blocks = blocks
        self.entries: dict[PrefixKey, PrefixEntry] = {}
        self._next_owner = -1
        self.num_hits = 0
        self.num_loose_queries = 0  # loose lookups (the cross-request prefix cache), for /metrics
        self.num_loose_hits = 0

    def acquire(self, key: PrefixKey, token_ids: list[int], level: str) -> tuple[PrefixEntry, bool]:
        """The entry for key (created if new); True when it must still be computed."""
        entry = self.entries.get(key)
        self.num_loose_queries += level == "loose"
        if entry is not None and entry.token_ids == token_ids:  # tokens compared too: a hash is not proof
            entry.waiting += 1
            entry.last_used = time.monotonic()
            self.num_hits += entry.ready
            self.num_loose_hits += level == "loose"  # found: its K/V are not computed again
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
