"""Paged attention for decode rows and prefill chunks alike: each row reads its own channel's keys in place.

One program per (row, key/value head); the query heads that share that key/value head (GQA) go together. A row sees
the first `length` keys of its channel, walked block by block through its block table (one key tile = one cache
block, always the same size), left to right, with an online softmax in fp32. There is no split over keys, so a row's
reduction order is fixed by its own length alone: alone or beside 63 other rows, decode or prefill, its bits are
the same. A prefill chunk's row at position p simply has length p + 1 (causal within the chunk). A row of length 0
(tile padding) writes zeros.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_attention_kernel(q_ptr, q_row_stride, kv_ptr, out_ptr, tables_ptr, table_stride, lengths_ptr, num_slots,
                            scale, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                            GROUP: tl.constexpr, GROUP_BLOCK: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    group = tl.arange(0, GROUP_BLOCK)[:, None]  # this key/value head's query heads
    dims = tl.arange(0, HEAD_DIM)[None, :]
    heads = kv_head * GROUP + group
    live = group < GROUP
    q = tl.load(q_ptr + row * q_row_stride + heads * HEAD_DIM + dims, mask=live, other=0.0).to(tl.float32)
    length = tl.load(lengths_ptr + row).to(tl.int32)  # int32 or int64 in memory; the loop bound as int32
    best = tl.full((GROUP_BLOCK,), float("-inf"), tl.float32)
    total = tl.zeros((GROUP_BLOCK,), tl.float32)
    acc = tl.zeros((GROUP_BLOCK, HEAD_DIM), tl.float32)
    offsets = tl.arange(0, BLOCK_SIZE)
    for index in range(0, tl.cdiv(length, BLOCK_SIZE)):
        block = tl.load(tables_ptr + row * table_stride + index).to(tl.int64)
        seen = index * BLOCK_SIZE + offsets < length  # [BLOCK_SIZE]
        slots = block * BLOCK_SIZE + offsets
        at = (slots[:, None] * KV_HEADS + kv_head) * HEAD_DIM + dims  # [BLOCK_SIZE, HEAD_DIM]
        keys = tl.load(kv_ptr + at, mask=seen[:, None], other=0.0).to(tl.float32)
        values = tl.load(kv_ptr + num_slots * KV_HEADS * HEAD_DIM + at, mask=seen[:, None], other=0.0)
        scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [GROUP_BLOCK, BLOCK_SIZE]
        scores = tl.where(seen[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        kept = tl.exp(best - new_best)  # 0 on the first tile (best = -inf)
        weights = tl.exp(scores - new_best[:, None])
        total = total * kept + tl.sum(weights, axis=1)
        acc = acc * kept[:, None] + tl.sum(weights[:, :, None] * values.to(tl.float32)[None, :, :], axis=1)
        best = new_best
    result = acc / tl.where(total > 0, total, 1.0)[:, None]  # a length-0 row: acc is 0, so zeros
    tl.store(out_ptr + (row * HEADS + heads) * HEAD_DIM + dims, result.to(out_ptr.dtype.element_ty), mask=live)


def paged_attention(q: torch.Tensor, kv: torch.Tensor, tables: torch.Tensor, lengths: torch.Tensor, block_size: int,
                    scale: float) -> torch.Tensor:
    """q: [rows, heads, head_dim] (rows may be strided, e.g. a view into the fused qkv rows); kv: [2, num_slots,
    kv_heads, head_dim]; tables: [rows, width] the block ids of each row's channel; lengths: [rows] keys each row
    sees. Returns [rows, heads, head_dim]."""
    rows, heads, head_dim = q.shape
    kv_heads = kv.shape[2]
    assert q.stride(2) == 1 and q.stride(1) == head_dim and kv.is_contiguous()
    assert tables.stride(1) == 1 and lengths.is_contiguous()
    out = torch.empty(rows, heads, head_dim, dtype=q.dtype, device=q.device)
    if rows:
        group = heads // kv_heads
        _paged_attention_kernel[(rows, kv_heads)](
            q, q.stride(0), kv, out, tables, tables.stride(0), lengths, kv.shape[1], scale, HEADS=heads,
            KV_HEADS=kv_heads, HEAD_DIM=head_dim, GROUP=group, GROUP_BLOCK=triton.next_power_of_2(group),
            BLOCK_SIZE=block_size)
    return out
