"""Prefix jobs: compute each declared shared prefix once, then attach it to the channels that need it.

A job is prefill-only work whose KV blocks belong to a PrefixEntry owner (a negative owner id),
never to a channel. Its chunks are cut exactly as a solo run of any of its questions would cut
them, so attaching the prefix is bit-identical to computing it in the channel.
"""
from __future__ import annotations

from dataclasses import dataclass

from kev.engine.question import Question
from kev.engine.kv.block_manager import BlockManager
from kev.engine.kv.prefix_store import PrefixEntry, PrefixStore, prefix_key

SlotCopy = tuple[list[int], list[int]]  # (source slots, destination slots)


@dataclass(eq=False)
class PrefixJob:
    """The prefill of one shared prefix into its owner's blocks; never samples."""

    entry: PrefixEntry
    prompt_ids: list[int]
    num_computed: int = 0
    prefix_len: int = 0  # a job attaches no prefix of its own: its chunks count from 0

    @property
    def channel_id(self) -> int:
        return self.entry.owner_id

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids

    @property
    def is_done(self) -> bool:
        return self.num_computed == len(self.prompt_ids)


class PrefixJobs:
    def __init__(self, blocks: BlockManager, store: PrefixStore) -> None:
        self.blocks, self.store = blocks, store
        self.jobs: list[PrefixJob] = []
        self._copies: list[SlotCopy] = []  # applied by the model runner before the next forward

    def register(self, q: Question) -> None:
        """Called when a question with a declared prefix is queued."""
        assert q.prefix_ids
        # loose caches across requests: the operator's public prefix for everyone, any other only for its tenant
        key = prefix_key(q.isolation, q.prefix_ids, q.request_id, q.tenant, q.prefix_public)
        entry, is_new = self.store.acquire(key, q.prefix_ids, q.isolation, q.tenant)
        q.prefix = entry
        if is_new:
            self.blocks.promise(entry.owner_id, entry.num_tokens)
            self.jobs.append(PrefixJob(entry, list(q.prefix_ids)))

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
            self._copies.append((self.blocks.slots(entry.owner_id, copy_from, length),
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
            self.jobs = [job for job in self.jobs if job.entry is not entry]

    def finish_done(self) -> None:
        """After a forward: the jobs whose prefix is whole hand it to the store (their questions may attach)."""
        for job in [job for job in self.jobs if job.is_done]:
            self.store.finish(job.entry)
            self.jobs.remove(job)

    def take_copies(self) -> list[SlotCopy]:
        copies, self._copies = self._copies, []
        return copies
