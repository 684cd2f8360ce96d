"""StepMetadata: the one object the engine's bookkeeping and the model's math both touch.

It describes a packed step as per-channel spans over one flat token batch and the
paged KV cache. There is no [T, T] mask: attention of a channel is computed from its
own span and its own key slots, so block-diagonal isolation is structural.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


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
    tiles: list[int]  # row-tile sizes in order, sum == num_rows (see model/linear.py)
    token_rows: torch.Tensor  # [num_tokens] rows holding real tokens
    slot_mapping: torch.Tensor  # [num_tokens] cache slot where each real token's K/V goes
    spans: list[ChannelSpan]
    sample_rows: torch.Tensor  # [num_samples] rows whose next-token logits are needed
    sample_tiles: list[int]  # row tiles of the lm_head GEMM over the sampled rows (padded)

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.numel()

    @cached_property
    def padding_rows(self) -> torch.Tensor | None:
        """Rows that hold no token (tile or minimum-size padding), or None."""
        num_rows = self.input_ids.numel()
        if num_rows == self.num_tokens:
            return None
        mask = torch.ones(num_rows, dtype=torch.bool, device=self.input_ids.device)
        mask[self.token_rows] = False
        return mask.nonzero().flatten()

    @cached_property
    def decode_batch(self) -> DecodeBatch | None:
        """Every one-query span, for the in-place decode kernel (None when there is none)."""
        spans = [span for span in self.spans if span.q_len == 1]
        return DecodeBatch.build(spans) if spans else None

    @cached_property
    def chunk_spans(self) -> list[ChannelSpan]:
        """The spans with several query rows (prefill chunks): attended one by one."""
        return [span for span in self.spans if span.q_len > 1]


@dataclass
class DecodeBatch:
    """The one-query channels of a step as flat arrays: channel c's keys are kv_slots[offsets[c]:offsets[c + 1]]."""

    rows: torch.Tensor  # [B] the query row of each channel
    kv_slots: torch.Tensor  # [sum of ctx_len] each channel's key slots in position order
    offsets: torch.Tensor  # [B + 1]

    @staticmethod
    def build(spans: list[ChannelSpan]) -> DecodeBatch:
        device = spans[0].kv_slots.device
        rows = torch.tensor([s.q_start for s in spans], dtype=torch.long, device=device)
        offsets = torch.tensor([0] + [s.ctx_len for s in spans], dtype=torch.long, device=device).cumsum(0)
        return DecodeBatch(rows, torch.cat([s.kv_slots for s in spans]), offsets)
