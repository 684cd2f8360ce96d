"""StepMetadata: the one object the engine's bookkeeping and the model's math both touch.

It describes a packed step as per-channel spans over one flat token batch and the
paged KV cache. There is no [T, T] mask: attention of a channel is computed from its
own span and its own key slots, so block-diagonal isolation is structural.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

# Decode attention runs over a channel's keys padded (masked) to a multiple of this, so that
# channels of the same padded length share one batched call; the padding depends only on the
# channel's own context length, so its bits are the same alone or packed.
KEY_BUCKET = 64


@dataclass
class ChannelSpan:
    """One channel's part of the step."""

    channel_id: int
    q_start: int  # first row of this channel in the packed batch
    q_len: int  # rows it contributes this step
    ctx_len: int  # keys it attends to (cached + new), ending at its last new token
    kv_slots: torch.Tensor  # [ctx_len] cache slots of those keys, in position order
    attn_mask: torch.Tensor | None  # [q_len, ctx_len] bool; None when is_causal or q_len == 1
    is_causal: bool  # the chunk starts at position 0 (q_len == ctx_len): plain causal
    prefix_len: int = 0  # leading keys that are an attached shared prefix (the audit's allowed span)


@dataclass
class StepMetadata:
    input_ids: torch.Tensor  # [num_rows]: real tokens plus zero padding that fills each tile
    positions: torch.Tensor  # [num_rows] restart at 0 in every channel
    tiles: list[int]  # row-tile sizes in order, sum == num_rows (see TiledLinear)
    token_rows: torch.Tensor  # [num_tokens] rows holding real tokens
    slot_mapping: torch.Tensor  # [num_tokens] cache slot where each real token's K/V goes
    spans: list[ChannelSpan]
    sample_rows: torch.Tensor  # [num_samples] rows whose next-token logits are needed

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.numel()

    @cached_property
    def decode_groups(self) -> list[DecodeGroup]:
        """The one-query spans, grouped by padded context length. Built from the spans on first use
        (after any audit or test hook has seen them), so the keys attended are the spans' own."""
        by_length: dict[int, list[ChannelSpan]] = {}
        for span in self.spans:
            if span.q_len == 1:
                by_length.setdefault(-(-span.ctx_len // KEY_BUCKET) * KEY_BUCKET, []).append(span)
        return [DecodeGroup.build(spans, length) for length, spans in by_length.items()]

    @cached_property
    def chunk_spans(self) -> list[ChannelSpan]:
        """The spans with several query rows (prefill chunks): attended one by one."""
        return [span for span in self.spans if span.q_len > 1]


@dataclass
class DecodeGroup:
    """Channels with one query row each and the same padded key length, attended in one call."""

    rows: torch.Tensor  # [B] the query row of each channel
    kv_slots: torch.Tensor  # [B * padded_len] each channel's key slots, padded with its own first slot
    key_mask: torch.Tensor  # [B, 1, 1, padded_len] True for the channel's real keys
    padded_len: int

    @staticmethod
    def build(spans: list[ChannelSpan], padded_len: int) -> DecodeGroup:
        device = spans[0].kv_slots.device
        slots = [torch.cat([s.kv_slots, s.kv_slots[:1].expand(padded_len - s.ctx_len)]) for s in spans]
        lengths = torch.tensor([s.ctx_len for s in spans], device=device)
        key_mask = torch.arange(padded_len, device=device)[None, :] < lengths[:, None]
        rows = torch.tensor([s.q_start for s in spans], dtype=torch.long, device=device)
        return DecodeGroup(rows, torch.cat(slots), key_mask[:, None, None, :], padded_len)
