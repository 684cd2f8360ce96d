"""Rotary embedding in place on a row's query and key heads, with the row's key and value written into its cache slot.

One program per row; elementwise (nothing is summed), so a row's bits depend on its own values and position only.
A row whose slot is -1 (tile padding) writes nothing into the cache.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_store_kv_kernel(qkv_ptr, kv_ptr, cos_ptr, sin_ptr, positions_ptr, slots_ptr, num_slots,
                          HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                          TURNED: tl.constexpr, HALF: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    base = qkv_ptr + row * width
    position = tl.load(positions_ptr + row).to(tl.int64)
    heads = tl.arange(0, TURNED)[:, None]  # query heads, then key heads
    half = tl.arange(0, HALF)[None, :]
    live = heads < HEADS + KV_HEADS
    first = tl.load(base + heads * HEAD_DIM + half, mask=live, other=0.0)
    second = tl.load(base + heads * HEAD_DIM + HEAD_DIM // 2 + half, mask=live, other=0.0)
    cos_first = tl.load(cos_ptr + position * HEAD_DIM + half).to(tl.float32)
    cos_second = tl.load(cos_ptr + position * HEAD_DIM + HEAD_DIM // 2 + half).to(tl.float32)
    sin_first = tl.load(sin_ptr + position * HEAD_DIM + half).to(tl.float32)
    sin_second = tl.load(sin_ptr + position * HEAD_DIM + HEAD_DIM // 2 + half).to(tl.float32)
    a, b = first.to(tl.float32), second.to(tl.float32)
    dtype = first.dtype
    # x·cos + rotate_half(x)·sin, each product rounded to the model dtype as torch's reference rounds it
    new_first = ((a * cos_first).to(dtype).to(tl.float32) + (-b * sin_first).to(dtype).to(tl.float32)).to(dtype)
    new_second = ((b * cos_second).to(dtype).to(tl.float32) + (a * sin_second).to(dtype).to(tl.float32)).to(dtype)
    tl.store(base + heads * HEAD_DIM + half, new_first, mask=live)
    tl.store(base + heads * HEAD_DIM + HEAD_DIM // 2 + half, new_second, mask=live)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if slot >= 0:
        key_heads = heads - HEADS
        is_key = (key_heads >= 0) & live
        to_key = kv_ptr + slot * KV_HEADS * HEAD_DIM + key_heads * HEAD_DIM
        tl.store(to_key + half, new_first, mask=is_key)
        tl.store(to_key + HEAD_DIM // 2 + half, new_second, mask=is_key)
        dims = tl.arange(0, 2 * HALF)[None, :]
        is_value = heads < KV_HEADS  # the value heads, read with the same head index range
        value = tl.load(base + (HEADS + KV_HEADS + heads) * HEAD_DIM + dims, mask=is_value, other=0.0)
        to_value = kv_ptr + (num_slots + slot) * KV_HEADS * HEAD_DIM + heads * HEAD_DIM + dims
        tl.store(to_value, value, mask=is_value)


def rope_store_kv(qkv: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> None:
    """qkv: [rows, (heads + 2 kv_heads) * head_dim] contiguous, turned in place; kv: [2, num_slots, kv_heads, head_dim];
    cos, sin: [max_positions, head_dim]; positions, slots: [rows] (slot -1: write nothing)."""
    assert qkv.is_contiguous() and kv.is_contiguous() and head_dim % 2 == 0
    if qkv.shape[0]:
        _rope_store_kv_kernel[(qkv.shape[0],)](
            qkv, kv, cos, sin, positions, slots, kv.shape[1], HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim,
            TURNED=triton.next_power_of_2(heads + kv_heads), HALF=head_dim // 2)
