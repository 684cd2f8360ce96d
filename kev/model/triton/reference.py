"""The Triton kernels' operations in torch, over the same static, tensor-only inputs.

The tests compare each kernel with these; on a machine without Triton they stand in for the kernels in the decode step
so its graph structure can be checked on CPU (no host synchronisation, no data-dependent shape). They follow the torch
path's rounding (kev/model/llama.py) but not its reduction order: close to the kernels, not bit-equal to them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def add_rms_norm(x: torch.Tensor, pending: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if pending is not None:
        x.add_(pending)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def gated(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up


def argmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)


def rope_store_kv(qkv: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> None:
    rows = qkv.shape[0]
    turned = qkv[:, : (heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    half = head_dim // 2
    rotated = torch.cat([-turned[..., half:], turned[..., :half]], dim=-1)
    turned.copy_(turned * c + rotated * s)
    new_kv = qkv[:, heads * head_dim:].view(rows, 2, kv_heads, head_dim).transpose(0, 1)  # [2, rows, kv_heads, dim]
    # Padding rows (slot -1) write into a spare slot past the cache's end, dropped after: no data-dependent shape.
    spare = torch.cat([kv, kv.new_zeros(2, 1, kv_heads, head_dim)], dim=1)
    spare.index_copy_(1, torch.where(slots >= 0, slots, kv.shape[1]), new_kv)
    kv.copy_(spare[:, : kv.shape[1]])


def paged_attention(q: torch.Tensor, kv: torch.Tensor, tables: torch.Tensor, lengths: torch.Tensor, block_size: int,
                    scale: float) -> torch.Tensor:
    rows, heads, head_dim = q.shape
    kv_heads = kv.shape[2]
    offsets = torch.arange(block_size, device=q.device)
    slots = (tables.long()[:, :, None] * block_size + offsets).flatten(1)  # [rows, width * block_size]
    keys, values = kv[0][slots], kv[1][slots]  # [rows, keys, kv_heads, dim]
    keys = keys.repeat_interleave(heads // kv_heads, dim=2).float()
    values = values.repeat_interleave(heads // kv_heads, dim=2).float()
    scores = torch.einsum("rhd,rkhd->rhk", q.float(), keys) * scale
    seen = torch.arange(slots.shape[1], device=q.device)[None, :] < lengths[:, None]  # [rows, keys]
    scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a length-0 row: all -inf -> zeros
    return torch.einsum("rhk,rkhd->rhd", weights, values).to(q.dtype)
