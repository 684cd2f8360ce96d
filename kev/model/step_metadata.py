"""StepMetadata: the one object the engine's bookkeeping and the model's math both touch.

It describes a packed step as per-channel spans over one flat token batch and the
paged KV cache. There is no [T, T] mask: attention of a channel is computed from its
own span and its own key slots, so block-diagonal isolation is structural.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

# Attention paths (model/attention.py). In bf16 with the AVX-512 BF16 kernels, decode rows take the row kernel
# (kernels/paged_attention.cpp) and every prefill chunk, whatever its length, the flash-style prefill kernel
# (kernels/prefill_attention.cpp); otherwise every row takes the row kernel. Both compute a row from its own
# channel's keys in an order fixed by its own position, so a row's bits never depend on how its prompt was
# chunked or on what else is in the step.


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
    decode: bool = False  # a sampled token's row (not part of a prompt): the row kernel even beside prefill


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
    def kernel_batch(self) -> KernelBatch | None:
        """Every row, for the row kernel (None when the step has none)."""
        return KernelBatch.build(self.spans) if self.spans else None

    @cached_property
    def decode_batch(self) -> KernelBatch | None:
        """Decode rows only, for the row kernel beside the prefill kernel."""
        spans = [span for span in self.spans if span.decode]
        return KernelBatch.build(spans) if spans else None

    @cached_property
    def prefill_batch(self) -> PrefillBatch | None:
        """Prompt chunks, for the prefill kernel (None when the step has none)."""
        spans = [span for span in self.spans if not span.decode]
        return PrefillBatch.build(spans) if spans else None


@dataclass
class PrefillBatch:
    """Prompt chunks for kernels/prefill_attention.cpp: chunk i's rows are spans[i] = (q_start, q_len, ctx_len,
    slot_offset); they are the last q_len positions of a context whose ctx_len key slots start at slot_offset."""

    spans: torch.Tensor  # [n, 4] int64
    kv_slots: torch.Tensor  # every chunk's context slots in position order, one chunk after another

    @staticmethod
    def build(spans: list[ChannelSpan]) -> PrefillBatch:
        rows, offset = [], 0
        for s in spans:
            rows.append([s.q_start, s.q_len, s.ctx_len, offset])
            offset += s.ctx_len
        device = spans[0].kv_slots.device
        return PrefillBatch(torch.tensor(rows, dtype=torch.long, device=device),
                            torch.cat([s.kv_slots for s in spans]))


@dataclass
class KernelBatch:
    """Query rows as flat arrays: row i attends to kv_slots[starts[i] : starts[i] + lengths[i]]."""

    rows: torch.Tensor  # [Q] query rows
    kv_slots: torch.Tensor  # every channel's key slots in position order, one channel after another
    starts: torch.Tensor  # [Q] where row i's channel begins in kv_slots
    lengths: torch.Tensor  # [Q] keys row i sees (causal within its chunk)

    @staticmethod
    def build(spans: list[ChannelSpan]) -> KernelBatch:
        device = spans[0].kv_slots.device
        rows: list[int] = []
        starts: list[int] = []
        lengths: list[int] = []
        offset = 0
        for s in spans:
            first_position = s.ctx_len - s.q_len
            rows.extend(range(s.q_start, s.q_start + s.q_len))
            starts.extend([offset] * s.q_len)
            lengths.extend(range(first_position + 1, s.ctx_len + 1))
            offset += s.ctx_len
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        return KernelBatch(as_tensor(rows), torch.cat([s.kv_slots for s in spans]), as_tensor(starts),
                           as_tensor(lengths))

    def windowed(self, window: int) -> KernelBatch:
        """The same rows over only their last `window` keys (a sliding-window layer): the start moves, nothing else."""
        hidden = (self.lengths - window).clamp(min=0)
        return KernelBatch(self.rows, self.kv_slots, self.starts + hidden, self.lengths - hidden)
