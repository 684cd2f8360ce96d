"""A linear layer whose row results never depend on how many rows are in the batch.

torch's CPU GEMM picks its blocking from M (the row count), so the same row gets
different bits at M=1, M=3 or M=40 (shared/notes/batch-invariance-cpu.md). Running
every product over fixed-size tiles of rows gives each row one reduction order
whatever else shares the step, as long as the size of the tile a row lands in
depends only on that row's own question (see engine/packer.py's tile plan).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TiledLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        # x: [sum(tiles), in_features]; each tile is multiplied on its own.
        return tiled_matmul(x, self.weight, self.bias, tiles)


def tiled_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tiles: list[int]) -> torch.Tensor:
    if len(tiles) <= 1:
        return F.linear(x, weight, bias)
    return torch.cat([F.linear(rows, weight, bias) for rows in x.split(tiles)])


def pad_rows(x: torch.Tensor, tile: int) -> torch.Tensor:
    """Pad dim 0 with zeros up to a multiple of tile."""
    missing = (-x.shape[0]) % tile
    if missing == 0:
        return x
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))])
