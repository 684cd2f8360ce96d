"""Prefix jobs: compute each declared shared prefix once, then attach it to the channels that need it.

A job is a prefill-only pseudo-question whose KV blocks belong to a PrefixEntry owner
(a negative owner id), never to a channel. Its chunks are cut exactly as a solo run of
any of its questions would cut them, so attaching the prefix is bit-identical to
computing it in the channel.
"""
from __future__ import annotations

from kev.engine.question import Phase, Question, SamplingParams
from kev.isolation.block_manager import BlockManager
from kev.isolation.prefix_store import PrefixEntry, PrefixStore, prefix_key

SlotCopy = tuple[list[int], list[int]]  # (source slots, destination slots)


class PrefixJobs:
    def __init__(self, blocks: BlockManager, store: PrefixStore) -> None:
        self.blocks, self.store = blocks, store
        self.jobs: list[tuple[Question, PrefixEntry]] = []
        self.pending_copies: list[SlotCopy] = []  # applied by the model runner before the next forward
        self.num_prefix_tokens_computed = 0

    def register(self, q: Question) -> None:
        """Called when a question with a declared prefix is queued."""
        assert q.prefix_ids
        level = "loose" if q.prefix_public and q.isolation == "loose" else q.isolation
        key = prefix_key(level, q.prefix_ids, q.request_id, "public")
        entry, is_new = self.store.acquire(key, q.prefix_ids, level)
        q.prefix = entry
        if is_new:
            job = Question(f"prefix:{entry.owner_id}", -1, list(q.prefix_ids), SamplingParams(max_tokens=1),
                           timeout_ms=2**31, isolation=level)
            job.channel_id, job.phase = entry.owner_id, Phase.PREFILL
            self.blocks.promise(entry.owner_id, entry.num_tokens)
            self.jobs.append((job, entry))

    def is_ready(self, q: Question) -> bool:
        return q.prefix is None or q.prefix.ready

    def attach(self, q: Question) -> None:
        """Give the newly admitted question the prefix's K/V: private copies (strict) or shared blocks."""
        entry, channel = q.prefix, q.channel_id
        assert entry is not None and entry.ready and channel is not None
        size, length = self.blocks.block_size, entry.num_tokens
        copy_from = 0
        if q.isolation != "strict":
            shared = self.store.shared_blocks(entry)
            self.blocks.share(channel, shared)
            copy_from = len(shared) * size
        self.blocks.ensure(channel, length)
        if copy_from < length:
            self.pending_copies.append((self.blocks.slots(entry.owner_id, copy_from, length),
                                        self.blocks.slots(channel, copy_from, length)))
        q.num_computed, q.prefix_len, q.prefix = length, length, None
        self.store.detach(entry)

    def forget(self, q: Question) -> None:
        """A question that never attached (cancelled, timed out): stop holding its entry."""
        entry, q.prefix = q.prefix, None
        if entry is None:
            return
        self.store.detach(entry)
        if entry.key not in self.store.entries:  # dropped: its job is moot
            self.jobs = [(job, e) for job, e in self.jobs if e is not entry]

    def after_step(self) -> None:
        for job, entry in list(self.jobs):
            if job.num_computed == len(job.prompt_ids):
                self.store.finish(entry)
                self.jobs.remove((job, entry))

    def take_copies(self) -> list[SlotCopy]:
        copies, self.pending_copies = self.pending_copies, []
        return copies
