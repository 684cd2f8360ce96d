"""Row kernels: RMSNorm with the residual add, SiLU·mul, GeGLU (gelu_tanh·mul) and greedy argmax.

One program per row (RMSNorm, argmax) or per row and fixed column block (the gated activations, which reduce
nothing): a row's reduction spans exactly its own hidden size or vocabulary, in one fixed order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

GATE_BLOCK = 1024  # columns per program of the gated activations (elementwise: any fixed size keeps the bits)
ARGMAX_BLOCK = 4096  # vocabulary entries per step of a row's argmax scan


@triton.jit
def _add_rms_norm_kernel(x_ptr, pending_ptr, weight_ptr, out_ptr, n_cols, eps, HAS_PENDING: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    if HAS_PENDING:  # the residual add, rounded to the stream's dtype (as torch's in-place add)
        pending = tl.load(pending_ptr + row * n_cols + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + pending.to(tl.float32)).to(x.dtype)
        tl.store(x_ptr + row * n_cols + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    inverse = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / n_cols + eps)  # fp32 statistics, as Hugging Face
    normed = (x32 * inverse).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, (weight.to(tl.float32) * normed.to(tl.float32)).to(x.dtype), mask=mask)


def add_rms_norm(x: torch.Tensor, pending: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [rows, hidden] contiguous, the residual stream (pending is added into it in place). Returns the norm."""
    assert x.is_contiguous() and (pending is None or pending.is_contiguous())
    out = torch.empty_like(x)
    rows, cols = x.shape
    if rows:
        _add_rms_norm_kernel[(rows,)](x, pending if pending is not None else x, weight, out, cols, eps,
                                      HAS_PENDING=pending is not None, BLOCK=triton.next_power_of_2(cols))
    return out


@triton.jit
def _gated_kernel(gate_up_ptr, out_ptr, n_cols, GELU: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_up_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if GELU:  # gelu with the tanh approximation; tanh(z) = 2 sigmoid(2z) - 1
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (2.0 * tl.sigmoid(2.0 * inner))
    else:
        act = g * tl.sigmoid(g)
    act = act.to(gate.dtype)  # rounded as torch rounds F.silu / F.gelu's output, then the product
    tl.store(out_ptr + row * n_cols + cols, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=mask)


def gated(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """gate_up: [rows, 2 I] (gate then up). Returns silu(gate)·up, or gelu_tanh(gate)·up: [rows, I]."""
    assert gate_up.is_contiguous()
    rows, width = gate_up.shape
    out = gate_up.new_empty(rows, width // 2)
    if rows:
        _gated_kernel[(rows, triton.cdiv(width // 2, GATE_BLOCK))](gate_up, out, width // 2, GELU=gelu,
                                                                    BLOCK=GATE_BLOCK)
    return out


@triton.jit
def _argmax_kernel(logits_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    best = tl.full((), float("-inf"), tl.float32)
    best_index = tl.full((), 0, tl.int64)
    for start in range(0, n_cols, BLOCK):  # a fixed left-to-right scan: the first maximum wins, as torch.argmax
        cols = start + tl.arange(0, BLOCK)
        values = tl.load(logits_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        top = tl.max(values, axis=0)
        index = tl.min(tl.where(values == top, cols, n_cols), axis=0).to(tl.int64)
        better = top > best
        best_index = tl.where(better, index, best_index)
        best = tl.where(better, top, best)
    tl.store(out_ptr + row, best_index)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits: [rows, vocab] contiguous. Greedy picks [rows] int64 (exact: no rounding, the first maximum)."""
    assert logits.is_contiguous()
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    if logits.shape[0]:
        _argmax_kernel[(logits.shape[0],)](logits, out, logits.shape[1], BLOCK=ARGMAX_BLOCK)
    return out
