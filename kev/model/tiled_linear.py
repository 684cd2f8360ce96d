"""A linear layer whose row results never depend on how many rows are in the batch.

torch's CPU GEMM picks its blocking from M (the row count), so the same row gets
different bits at M=1, M=3 or M=40 (shared/notes/batch-invariance-cpu.md). Running
every product in fixed tiles of `tile` rows, padded, gives each row one reduction
order whatever else shares the step. Callers pass inputs already padded to a
multiple of the tile, so no copy happens here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TiledLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, tile: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.tile = tile

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_rows, in_features], num_rows a multiple of self.tile
        if x.shape[0] <= self.tile:
            return F.linear(x, self.weight, self.bias)
        return torch.cat([F.linear(rows, self.weight, self.bias) for rows in x.split(self.tile)])


def pad_rows(x: torch.Tensor, tile: int) -> torch.Tensor:
    """Pad dim 0 with zeros up to a multiple of tile."""
    missing = (-x.shape[0]) % tile
    if missing == 0:
        return x
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))])
