"""Paged, per-channel attention: each channel attends over exactly its own keys.

Running each channel over its own key slots (never a length set by other channels)
keeps its reduction shapes identical alone or packed: that is what makes the
answer bit-identical to a solo run, and what makes cross-channel visibility impossible
by construction rather than by masking.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kev.model.step_metadata import ChannelSpan, StepMetadata


class PagedKVLayer:
    """One layer's cache: [2 (K, V), num_slots, num_kv_heads, head_dim], so one gather fetches both."""

    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        # empty, not zeros: a slot is read only after its owner wrote it (the span's ctx_len).
        self.kv = torch.empty(2, num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)

    def copy_slots(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        self.kv.index_copy_(1, destination, self.kv.index_select(1, source))


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: PagedKVLayer, meta: StepMetadata, decode_kernel: bool
) -> torch.Tensor:
    """q: [num_rows, heads, dim]; k, v: [num_rows, kv_heads, dim] for the new tokens. Returns [num_rows, heads, dim].

    decode_kernel: decode rows and short prefill chunks run Kev's C++ kernel (model/kernels), which reads
    each channel's keys in place, all in one call; long prefill chunks (and, without the kernel, every
    channel) are gathered and attended with SDPA, one call per channel."""
    new_kv = torch.stack([k, v]).index_select(1, meta.token_rows)  # [2, num_tokens, kv_heads, dim]
    cache.kv.index_copy_(1, meta.slot_mapping, new_kv)
    out = q.new_empty(q.shape)  # contiguous even where q is a view into the fused qkv rows
    if meta.padding_rows is not None:  # rows no channel owns: zeros, as every row is written below
        out.index_fill_(0, meta.padding_rows, 0)
    batch = meta.kernel_batch if decode_kernel else None
    if batch is not None:
        torch.ops.kev.paged_attention(q, cache.kv, out, batch.rows, batch.kv_slots, batch.starts, batch.lengths,
                                       q.shape[-1] ** -0.5)
    _spans_sdpa(q, cache, meta.long_chunks if decode_kernel else meta.spans, out)
    return out


def _spans_sdpa(q: torch.Tensor, cache: PagedKVLayer, spans: list[ChannelSpan], out: torch.Tensor) -> None:
    """One SDPA call per channel over exactly its own keys: torch's CPU SDPA splits its work by batch size,
    so batching channels (even of equal length) would change their bits."""
    for span in spans:
        rows = slice(span.q_start, span.q_start + span.q_len)
        keys_values = cache.kv.index_select(1, span.kv_slots).transpose(1, 2)  # [2, kv_heads, ctx_len, dim]
        queries = q[rows].transpose(0, 1)  # [heads, q_len, dim]
        o = F.scaled_dot_product_attention(
            queries.unsqueeze(0), keys_values[0:1], keys_values[1:2],
            attn_mask=span.attn_mask, is_causal=span.is_causal, enable_gqa=True,
        )  # [1, heads, q_len, dim]
        out[rows] = o[0].transpose(0, 1)
