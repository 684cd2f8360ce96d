"""Attention for families whose rotary or q/k path Llama's fused kernels do not cover.

Rotary runs in torch here (per row, so batch invariant): Qwen3 normalises q and k per head
before it, and Phi-3 turns only part of each head. Decode attention still uses Kev's kernel
where the layer's AttentionVariant allows it (not under Gemma 2's soft-capping).
"""
from __future__ import annotations

import torch

from kev.model.attention import AttentionVariant, PagedKVLayer, paged_attention
from kev.model.llama import Attention, RMSNorm
from kev.model.model_config import ModelConfig
from kev.model.rope import RotaryTable
from kev.model.step_metadata import StepMetadata


class FamilyAttention(Attention):
    def __init__(self, cfg: ModelConfig, variant: AttentionVariant | None) -> None:
        super().__init__(cfg, variant)
        # Hugging Face names (self_attn.q_norm / k_norm), so checkpoints load as they are.
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, rope: RotaryTable, meta: StepMetadata, cache: PagedKVLayer) -> torch.Tensor:
        qkv = self.qkv_proj(x, meta.tiles)  # [rows, (heads + 2 kv_heads) * dim]
        q, k, v = qkv.split(self.split_sizes, dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)  # [rows, heads, dim]
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)  # [rows, kv_heads, dim]
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = _per_head(self.q_norm, q), _per_head(self.k_norm, k)
        q, k = rope.apply(q, meta.positions), rope.apply(k, meta.positions)
        out = paged_attention(q, k, v, cache, meta, self.fused, self.variant)
        return self.o_proj(out.flatten(1), meta.tiles)  # [rows, hidden]


def _per_head(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm over each head: x [rows, heads, dim] seen as [rows * heads, dim] (the row kernel's shape)."""
    return norm(x.reshape(-1, x.shape[-1])).view(x.shape)
