"""BlockManager: who owns which KV block. Python ints only; the tensors live in the model runner.

Each owner has a block table (block ids in position order). Owners are channels
(ids >= 0) and shared-prefix entries (ids < 0). Blocks are handed out on demand
(split) or all at once (unified); a released block is free for anyone, and nothing
can attend to it until its new owner writes it, because attention reads only the
first ctx_len slots of the owner's own table. A block in more than one table must
be read-only (a finished shared prefix); anything else is an isolation bug.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

BlockEvent = Callable[[str, int, list[int]], None]  # (event "alloc" | "release", owner, block ids)


class OutOfBlocksError(RuntimeError):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, on_change: BlockEvent | None = None) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.on_change = on_change
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks
        self._tables: dict[int, list[int]] = {}
        self._promised: dict[int, int] = {}  # channel -> blocks it may still grow to
        self.read_only: set[int] = set()  # finished shared-prefix blocks: attend, never write

    # --- queries -------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, channel_id: int) -> list[int]:
        return self._tables.get(channel_id, [])

    def slots(self, channel_id: int, start: int, end: int) -> list[int]:
        """Flat cache slots of positions [start, end) of the channel."""
        table, size = self._tables[channel_id], self.block_size
        return [table[pos // size] * size + pos % size for pos in range(start, end)]

    def can_promise(self, num_tokens: int) -> bool:
        """Would a new channel needing num_tokens at most still fit beside every promise made?"""
        outstanding = sum(max(0, n - len(self.block_table(c))) for c, n in self._promised.items())
        return self.blocks_for(num_tokens) + outstanding <= len(self._free)

    # --- changes -------------------------------------------------------------
    def promise(self, channel_id: int, num_tokens: int) -> None:
        """Admit a channel that will grow to at most num_tokens (split: no blocks taken yet)."""
        self._promised[channel_id] = max(self.blocks_for(num_tokens), len(self.block_table(channel_id)))

    def reserve(self, channel_id: int, num_tokens: int) -> None:
        """Unified mode: take every block the channel may ever need, up front."""
        self.ensure(channel_id, num_tokens)

    def ensure(self, channel_id: int, num_tokens: int) -> None:
        """Grow the channel's table until it covers num_tokens positions."""
        table = self._tables.setdefault(channel_id, [])
        needed = self.blocks_for(num_tokens) - len(table)
        if needed > len(self._free):
            raise OutOfBlocksError(f"channel {channel_id} needs {needed} more KV blocks, {len(self._free)} free")
        taken = [self._free.popleft() for _ in range(max(0, needed))]
        for block in taken:
            self._ref_counts[block] += 1
            table.append(block)
        if taken and self.on_change:
            self.on_change("alloc", channel_id, taken)

    def trim(self, channel_id: int, num_tokens: int) -> list[int]:
        """Give back the channel's blocks past the first num_tokens positions (speculative rows it did not keep);
        they were its own and writable. Returns the freed ids."""
        table = self._tables.get(channel_id, [])
        keep = self.blocks_for(num_tokens)
        freed = table[keep:]
        if not freed:
            return []
        del table[keep:]
        for block in freed:
            assert block not in self.read_only, "a shared prefix block is never past the channel's own tokens"
            self._ref_counts[block] -= 1
            self._free.append(block)
        if self.on_change:
            self.on_change("release", channel_id, freed)
        return freed

    def share(self, owner: int, blocks: list[int]) -> None:
        """Append read-only blocks of a shared prefix to the owner's table (ref counted)."""
        assert all(b in self.read_only for b in blocks), "only read-only blocks may be shared"
        table = self._tables.setdefault(owner, [])
        for block in blocks:
            self._ref_counts[block] += 1
            table.append(block)

    def mark_read_only(self, blocks: list[int]) -> None:
        self.read_only.update(blocks)

    def release(self, channel_id: int) -> list[int]:
        """Drop the owner's references; blocks nobody references go back to the pool. Returns the freed ids."""
        self._promised.pop(channel_id, None)
        freed = []
        for block in self._tables.pop(channel_id, []):
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                self.read_only.discard(block)
                self._free.append(block)
                freed.append(block)
        if freed and self.on_change:
            self.on_change("release", channel_id, freed)
        return freed

    def owners(self) -> dict[int, list[int]]:
        """block id -> owners holding it (for the audit)."""
        holders: dict[int, list[int]] = {}
        for owner, table in self._tables.items():
            for block in table:
                holders.setdefault(block, []).append(owner)
        return holders

    # --- invariants ----------------------------------------------------------
    def integrity_problems(self) -> list[str]:
        """What breaks the invariants (empty when none does): every block is either free with no owner, or owned
        by exactly as many tables as its ref count; a block in two tables is read-only."""
        owners = [0] * self.num_blocks
        for table in self._tables.values():
            for block in table:
                owners[block] += 1
        free = set(self._free)
        problems = [] if len(free) == len(self._free) else ["a block is twice in the free list"]
        for block in range(self.num_blocks):
            held, counted = owners[block], self._ref_counts[block]
            if held != counted:
                problems.append(f"block {block}: ref count {counted} != {held} owners")
            if (block in free) != (held == 0):
                problems.append(f"block {block}: free={block in free} but has {held} owners")
            if held > 1 and block not in self.read_only:
                problems.append(f"block {block} is in {held} tables but writable")
        return problems

    def check_integrity(self) -> None:
        """AssertionError naming the first broken invariant (tests call it after every operation)."""
        problems = self.integrity_problems()
        assert not problems, "; ".join(problems[:5])
