"""Linear layers whose row results never depend on how many rows share the GEMM.

torch's CPU GEMM picks its blocking from M (the row count), so through `F.linear` the
same row gets different bits at M=1, M=3 or M=40 (shared/notes/batch-invariance-cpu.md).
Two ways out, chosen at start-up by `model/row_invariance.py`:

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


class PackedWeight:
    """A weight reordered once into oneDNN's blocked layout (an opaque mkldnn tensor)."""

    def __init__(self, weight: torch.Tensor, rows_hint: int) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [None], "")


class Linear(nn.Module):
    """y = x Wᵀ + b over row tiles; `tiles` is one entry (the whole step) under free rows."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.packed: PackedWeight | None = None

    def prepack(self, rows_hint: int) -> None:
        if can_prepack(self.weight):
            self.packed = PackedWeight(self.weight, rows_hint)

    def forward(self, x: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        # x: [sum(tiles), in_features]; each tile is multiplied on its own.
        return tiled_matmul(x, self.weight, self.bias, tiles, self.packed)


def tiled_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tiles: list[int],
                 packed: PackedWeight | None = None) -> torch.Tensor:
    multiply = packed if packed is not None else (lambda rows, b: F.linear(rows, weight, b))
    if len(tiles) <= 1:
        return multiply(x, bias)
    return torch.cat([multiply(rows, bias) for rows in x.split(tiles)])


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Pad dim 0 with zeros up to a multiple of rows."""
    missing = (-x.shape[0]) % rows
    if missing == 0:
        return x
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))])
