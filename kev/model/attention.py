"""Paged, per-channel attention: each channel attends over exactly its own keys.

Running each channel over its own key slots (never a length set by other channels; a
decode query's keys are padded to a length that depends only on its own context)
keeps its reduction shapes identical alone or packed: that is what makes the
answer bit-identical to a solo run, and what makes cross-channel visibility impossible
by construction rather than by masking.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kev.model.step_metadata import StepMetadata


class PagedKVLayer:
    """One layer's cache: [2 (K, V), num_slots, num_kv_heads, head_dim], so one gather fetches both."""

    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        # empty, not zeros: a slot is read only after its owner wrote it (the span's ctx_len).
        self.kv = torch.empty(2, num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)

    def copy_slots(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        self.kv.index_copy_(1, destination, self.kv.index_select(1, source))


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: PagedKVLayer, meta: StepMetadata
) -> torch.Tensor:
    """q: [num_rows, heads, dim]; k, v: [num_rows, kv_heads, dim] for the new tokens. Returns [num_rows, heads, dim]."""
    new_kv = torch.stack([k, v]).index_select(1, meta.token_rows)  # [2, num_tokens, kv_heads, dim]
    cache.kv.index_copy_(1, meta.slot_mapping, new_kv)
    out = torch.zeros_like(q)
    for group in meta.decode_groups:
        # One call per padded length: a per-channel call costs more in dispatch than in arithmetic.
        batch = group.rows.numel()
        keys_values = cache.kv.index_select(1, group.kv_slots).unflatten(1, (batch, group.padded_len))
        keys_values = keys_values.permute(0, 1, 3, 2, 4)  # [2, B, kv_heads, padded_len, dim]
        o = F.scaled_dot_product_attention(q.index_select(0, group.rows).unsqueeze(2), keys_values[0], keys_values[1],
                                           attn_mask=group.key_mask, enable_gqa=True)  # [B, heads, 1, dim]
        out.index_copy_(0, group.rows, o.squeeze(2))
    for span in meta.chunk_spans:
        rows = slice(span.q_start, span.q_start + span.q_len)
        keys_values = cache.kv.index_select(1, span.kv_slots).transpose(1, 2)  # [2, kv_heads, ctx_len, dim]
        queries = q[rows].transpose(0, 1)  # [heads, q_len, dim]
        o = F.scaled_dot_product_attention(
            queries.unsqueeze(0), keys_values[0:1], keys_values[1:2],
            attn_mask=span.attn_mask, is_causal=span.is_causal, enable_gqa=True,
        )  # [1, heads, q_len, dim]
        out[rows] = o[0].transpose(0, 1)
    return out
