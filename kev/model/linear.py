"""Linear layers whose row results never depend on how many rows share the GEMM.

torch's CPU GEMM picks its blocking from M (the row count), so through `F.linear` the
same row gets different bits at M=1, M=3 or M=40 (shared/notes/batch-invariance-cpu.md).
Three ways out, the first that applies wins; `model/row_invariance.py` checks the result at
start-up:

- *Kev's GEMM* (kernels/linear_gemm.cpp, CPUs with AVX-512 BF16): every output element is
  one accumulator summed over k in a fixed order, so a row's bits are the same for every M,
  M=1 included — invariant by construction, and faster than oneDNN at every M we measured.
- *free rows*: with weights prepacked once for oneDNN (what inductor's CPU freezing path
  does), every M ≥ 2 runs the same microkernel with the same K blocking, so a row's bits
  are one value whatever M is. The probe checks that for every shape, and then a step is
  one GEMM per layer over all its rows (padded to at least `min_rows`).
- *fixed tiles* (any kernel, any device): rows are multiplied in tiles whose size depends
  only on the row's own question (engine/packer.py's TilePlan).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN prepacking exists for CPU fp32 / bf16 weights."""
    return (weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available())


def can_use_kev_gemm(weight: torch.Tensor) -> bool:
    """Kev's GEMM: CPU fp32 / bf16 weights (bf16 reads k in pairs, so K must be even), kernels built with it."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return False
    if weight.dtype == torch.bfloat16 and weight.shape[1] % 2:
        return False
    return hasattr(torch.ops.kev, "linear_available") and bool(torch.ops.kev.linear_available())


class PackedWeight:
    """A weight reordered once into oneDNN's blocked layout (an opaque mkldnn tensor)."""

    kernel = "onednn-prepacked"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows_hint: int) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [None], "")


class GemmWeight:
    """A weight packed once for Kev's GEMM: blocks of 16 output columns, k-major inside a block
    (bf16: k in pairs, as vdpbf16ps reads them); the bias in fp32, padded to whole blocks."""

    kernel = "kev-gemm"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        out_features, in_features = weight.shape
        blocks = -(-out_features // 16)
        padded = F.pad(weight, (0, 0, 0, blocks * 16 - out_features))
        if weight.dtype == torch.bfloat16:
            pairs = padded.view(blocks, 16, in_features // 2, 2).permute(0, 2, 1, 3).contiguous()
            self.packed = pairs.view(torch.int32).view(blocks, in_features // 2, 16)
        else:
            self.packed = padded.view(blocks, 16, in_features).permute(0, 2, 1).contiguous()
        self.bias = None if bias is None else F.pad(bias.float(), (0, blocks * 16 - out_features))
        self.out_features = out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kev.linear(x.contiguous(), self.packed, self.bias, self.out_features)


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None, rows_hint: int,
                kev_gemm: bool) -> PackedWeight | GemmWeight | None:
    """The fastest row-invariant packing that applies, or None (F.linear over fixed tiles). kev_gemm: Kev's C++
    kernels are in use (core.kernels: auto and they built)."""
    if kev_gemm and can_use_kev_gemm(weight):
        return GemmWeight(weight, bias)
    if can_prepack(weight):
        return PackedWeight(weight, bias, rows_hint)
    return None


class Linear(nn.Module):
    """y = x Wᵀ + b over row tiles; `tiles` is one entry (the whole step) under free rows."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.packed: PackedWeight | GemmWeight | None = None

    def prepack(self, rows_hint: int, kev_gemm: bool) -> None:
        self.packed = pack_weight(self.weight, self.bias, rows_hint, kev_gemm)

    def forward(self, x: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        # x: [sum(tiles), in_features]; each tile is multiplied on its own.
        return tiled_matmul(x, self.weight, self.bias, tiles, self.packed)


def tiled_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tiles: list[int],
                 packed: PackedWeight | GemmWeight | None = None) -> torch.Tensor:
    multiply = packed if packed is not None else (lambda rows: F.linear(rows, weight, bias))
    if len(tiles) <= 1:
        return multiply(x)
    return torch.cat([multiply(rows) for rows in x.split(tiles)])


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Pad dim 0 with zeros up to a multiple of rows."""
    missing = (-x.shape[0]) % rows
    if missing == 0:
        return x
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))])
