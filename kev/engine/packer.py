"""Pack a step's work into StepMetadata: one flat token batch, per-channel spans.

Tile plan (why rows are laid out this way): a row's bits may depend on the size of the
GEMM it is multiplied in. Where the start-up probe (model/row_invariance.py) found that
they do not (every M ≥ min_rows gives the same bits), the whole step is one GEMM per
layer. Otherwise the size must depend only on the row's own question: decode rows (one
per channel) share small tiles; each prefill chunk gets tiles of its own, big ones
first, padded with zero rows that are never read back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from kev.engine.logprobs import logit_rows
from kev.engine.plan import Work
from kev.engine.kv.block_manager import BlockManager
from kev.model.step_metadata import ChannelSpan, PagedRows, StepMetadata


@dataclass(frozen=True)
class RowTiling:
    small: int  # decode rows (fixed tiles)
    big: int  # the body of a prefill chunk (fixed tiles)
    invariant: bool = True  # False: the whole step is one GEMM (for measuring what invariance costs)
    free_rows: bool = False  # the probe proved one GEMM per step invariant: no tiles at all
    min_rows: int = 1  # free rows: pad a GEMM to at least this many rows
    max_sample_rows: int = 0  # free rows: the most lm_head rows the probe verified in one GEMM (0: no limit)
    paged: bool = False  # device kernels (CUDA's Triton path) read the step's rows as PagedRows

    @property
    def is_one_gemm(self) -> bool:
        return self.free_rows or not self.invariant

    @property
    def label(self) -> str:
        if not self.invariant:
            return "tiles=step"
        return f"rows=free,min{self.min_rows}" if self.free_rows else f"tiles={self.small}/{self.big}"

    def for_step(self, num_rows: int) -> list[int]:
        """One GEMM over the step's rows (free rows, or invariance off)."""
        return [max(num_rows, self.min_rows)]

    def for_samples(self, num_rows: int) -> list[int]:
        """lm_head tiles: one GEMM up to the verified limit (more rows than that come with prompt logprobs)."""
        if not self.is_one_gemm:
            return self.for_decode(num_rows)
        limit = self.max_sample_rows or max(num_rows, 1)
        full, rest = divmod(num_rows, limit)
        return [limit] * full + (self.for_step(rest) if rest or not full else [])

    def for_chunk(self, length: int) -> list[int]:
        """Big tiles, then one tile (small, 2×small, … up to big) for the rest: one padded
        GEMM reads the weights once, which costs less than several small ones."""
        body, tail = divmod(length, self.big)
        tiles = [self.big] * body
        if tail:
            tile = self.small
            while tile < tail:
                tile = min(tile * 2, self.big)
            tiles.append(tile)
        return tiles

    def for_decode(self, num_rows: int) -> list[int]:
        return [self.small] * -(-num_rows // self.small)


class _Rows:
    """Accumulates rows and their tiles."""

    def __init__(self) -> None:
        self.input_ids: list[int] = []
        self.positions: list[int] = []
        self.token_rows: list[int] = []
        self.tiles: list[int] = []

    def add(self, ids: list[int], start_position: int) -> int:
        first = len(self.input_ids)
        self.token_rows.extend(range(first, first + len(ids)))
        self.input_ids.extend(ids)
        self.positions.extend(range(start_position, start_position + len(ids)))  # restart in every channel
        return first

    def close_tiles(self, tiles: list[int]) -> None:
        padding = sum(tiles) - (len(self.input_ids) - sum(self.tiles))
        self.input_ids.extend([0] * padding)
        self.positions.extend([0] * padding)
        self.tiles.extend(tiles)


def pack(work: list[Work], blocks: BlockManager, plan: RowTiling, device: torch.device) -> StepMetadata:
    """With plan.paged, the step's tensors stay on the host (the audit reads them there) and the model reads its rows
    from meta.paged, which reaches the device in one copy."""
    model_device, device = device, torch.device("cpu") if plan.paged else device
    rows = _Rows()
    spans: list[ChannelSpan] = []
    slot_mapping: list[int] = []
    sample_rows: list[int] = []
    argmax_only: list[bool] = []
    # Decode rows: one per sampled token, plus a drafted question's verify rows (positions past its prompt).
    decode = [w for w in work if w.start >= len(w.seq.prompt_ids)]
    decode_ids = {id(w) for w in decode}
    prefill = [w for w in work if id(w) not in decode_ids]
    one_gemm = plan.is_one_gemm
    key_slots = dict(zip(map(id, work), _key_slots(blocks, work, device)))
    for group in [decode] + [[w] for w in prefill]:
        first_row = len(rows.input_ids)
        for w in group:
            q, channel, end = w.seq, w.seq.channel_id, w.start + w.length
            assert channel is not None
            ids = q.all_ids[w.start:end] if not w.draft else q.all_ids[w.start:] + list(w.draft)
            q_start = rows.add(ids, w.start)
            slot_mapping.extend(blocks.slots(channel, w.start, end))
            kv_slots = key_slots[id(w)]
            if group is decode:
                # Every decode row is a span of its own, a drafted question's too: row start + i is exactly the decode
                # row plain decoding runs at that position (one query over its own start + i + 1 keys, the decode
                # attention path and its tiles), never a chunk read through the prompt path.
                spans.extend(ChannelSpan(channel, q_start + i, 1, w.start + i + 1, kv_slots[: w.start + i + 1], None,
                                         False, q.prefix_len, True) for i in range(w.length))
            else:
                spans.append(ChannelSpan(channel, q_start, w.length, end, kv_slots, _chunk_mask(w, device),
                                         w.start == 0, q.prefix_len, False))
            picked = logit_rows(w, q_start)  # the sampling row(s); all rows of a prompt being scored
            sample_rows.extend(picked)
            argmax_only.extend([w.argmax_only] * len(picked))
        if group and not one_gemm:
            num_rows = len(rows.input_ids) - first_row
            rows.close_tiles(plan.for_decode(num_rows) if group is decode else plan.for_chunk(group[0].length))
    if one_gemm:
        rows.close_tiles(plan.for_step(len(rows.input_ids)))
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    paged = None
    if plan.paged:
        tables = {s.channel_id: blocks.block_table(s.channel_id) for s in spans}
        paged = PagedRows.build(spans, tables, rows.input_ids, rows.positions, rows.token_rows, slot_mapping,
                                blocks.block_size, model_device)
    return StepMetadata(
        input_ids=as_tensor(rows.input_ids), positions=as_tensor(rows.positions), tiles=rows.tiles,
        sample_tiles=plan.for_samples(len(sample_rows)),
        token_rows=as_tensor(rows.token_rows), slot_mapping=as_tensor(slot_mapping), spans=spans,
        sample_rows=as_tensor(sample_rows), paged=paged,
        argmax_only=torch.tensor(argmax_only, dtype=torch.bool) if any(argmax_only) else None,
    )


def _key_slots(blocks: BlockManager, work: list[Work], device: torch.device) -> list[torch.Tensor]:
    """blocks.slots(channel, 0, end) of each piece of work, as tensors: views of one tensor that torch builds from the
    block tables in a few ops. A decode step of 64 channels over 600-token contexts built ~40,000 Python ints here each
    step (the host work a GPU step waits for); then a few torch ops a channel cost ~25 us each, 1.6 ms a step of 64."""
    if not work:
        return []
    size = blocks.block_size
    ends = [w.start + w.length for w in work]
    tables = [blocks.block_table(cast(int, w.seq.channel_id))[: -(-end // size)] for w, end in zip(work, ends)]
    table = torch.tensor([block for t in tables for block in t], dtype=torch.long)
    slots = (table[:, None] * size + torch.arange(size)).flatten().to(device)
    return [whole[:end] for whole, end in zip(slots.split([len(t) * size for t in tables]), ends)]


def _chunk_mask(w: Work, device: torch.device) -> torch.Tensor | None:
    """A later prefill chunk sees every cached key plus its own keys causally: [q_len, ctx_len]."""
    if w.start == 0 or w.length == 1:
        return None
    rows = torch.arange(w.length, device=device)[:, None] + w.start
    keys = torch.arange(w.start + w.length, device=device)[None, :]
    return keys <= rows
