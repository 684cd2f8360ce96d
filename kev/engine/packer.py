"""Pack a step's work into StepMetadata: one flat token batch, per-channel spans, no padding between channels."""
from __future__ import annotations

import torch

from kev.engine.scheduler import Work
from kev.isolation.block_manager import BlockManager
from kev.model.step_metadata import ChannelSpan, StepMetadata


def pack(work: list[Work], blocks: BlockManager, tile: int, device: torch.device) -> StepMetadata:
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    spans: list[ChannelSpan] = []
    sample_rows: list[int] = []
    for w in work:
        q, channel = w.question, w.question.channel_id
        assert channel is not None
        end = w.start + w.length
        q_start = len(input_ids)
        input_ids.extend(q.all_ids[w.start:end])
        positions.extend(range(w.start, end))  # positions restart at 0 in every channel
        slot_mapping.extend(blocks.slots(channel, w.start, end))
        kv_slots = torch.tensor(blocks.slots(channel, 0, end), dtype=torch.long, device=device)
        spans.append(ChannelSpan(channel, q_start, w.length, end, kv_slots, _chunk_mask(w, device), w.start == 0))
        if w.samples:
            sample_rows.append(q_start + w.length - 1)
    num_tokens = len(input_ids)
    padding = (-num_tokens) % tile
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return StepMetadata(
        input_ids=as_tensor(input_ids + [0] * padding),
        positions=as_tensor(positions + [0] * padding),
        num_tokens=num_tokens,
        slot_mapping=as_tensor(slot_mapping),
        spans=spans,
        sample_rows=as_tensor(sample_rows),
    )


def _chunk_mask(w: Work, device: torch.device) -> torch.Tensor | None:
    """A later prefill chunk sees every cached key plus its own keys causally: [q_len, ctx_len]."""
    if w.start == 0 or w.length == 1:
        return None
    rows = torch.arange(w.length, device=device)[:, None] + w.start
    keys = torch.arange(w.start + w.length, device=device)[None, :]
    return keys <= rows
