"""Paged, per-channel attention: each channel attends over exactly its own keys.

Running each channel over its own key slots (never a length set by other channels)
keeps its reduction shapes identical alone or packed: that is what makes the
answer bit-identical to a solo run, and what makes cross-channel visibility impossible
by construction rather than by masking.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kev.model.step_metadata import StepMetadata


class PagedKVLayer:
    """One layer's K and V slots: [num_slots, num_kv_heads, head_dim] each."""

    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        # empty, not zeros: a slot is read only after its owner wrote it (the span's ctx_len).
        self.k = torch.empty(num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.empty(num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: PagedKVLayer, meta: StepMetadata
) -> torch.Tensor:
    """q: [num_rows, heads, dim]; k, v: [num_rows, kv_heads, dim] for the new tokens. Returns [num_rows, heads, dim]."""
    cache.k.index_copy_(0, meta.slot_mapping, k.index_select(0, meta.token_rows))
    cache.v.index_copy_(0, meta.slot_mapping, v.index_select(0, meta.token_rows))
    out = torch.zeros_like(q)
    for span in meta.spans:
        rows = slice(span.q_start, span.q_start + span.q_len)
        keys = cache.k.index_select(0, span.kv_slots).transpose(0, 1)  # [kv_heads, ctx_len, dim]
        values = cache.v.index_select(0, span.kv_slots).transpose(0, 1)
        queries = q[rows].transpose(0, 1)  # [heads, q_len, dim]
        o = F.scaled_dot_product_attention(
            queries.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
            attn_mask=span.attn_mask, is_causal=span.is_causal and span.q_len > 1, enable_gqa=True,
        )  # [1, heads, q_len, dim]
        out[rows] = o[0].transpose(0, 1)
    return out
