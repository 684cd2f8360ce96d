"""A row's bits depend only on the size of its tile, never on its neighbours or its place in the batch."""
from __future__ import annotations

import pytest
import torch

from kev.engine.packer import RowTiling
from kev.model.linear import Linear

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile", [16, 32, 64])
def test_row_bits_independent_of_neighbours(dtype, tile):
    gen = torch.Generator().manual_seed(tile)
    for in_features, out_features in SHAPES:
        linear = Linear(in_features, out_features, bias=False)
        linear.weight.data = torch.randn(out_features, in_features, generator=gen).to(dtype)
        row = torch.randn(1, in_features, generator=gen).to(dtype)
        alone = linear(torch.cat([row, row.new_zeros(tile - 1, in_features)]), [tile])[0]
        for position in (0, tile // 2, tile - 1):
            neighbours = torch.randn(tile, in_features, generator=gen).to(dtype)
            neighbours[position] = row[0]
            batch = torch.cat([torch.randn(3 * tile, in_features, generator=gen).to(dtype), neighbours])
            out = linear(batch, [tile] * 4)
            assert torch.equal(out[3 * tile + position], alone), (in_features, out_features, position)


def test_row_tiling_depends_only_on_chunk_length():
    plan = RowTiling(16, 64)
    assert plan.for_chunk(16) == [16]
    assert plan.for_chunk(17) == [32]
    assert plan.for_chunk(45) == [64]
    assert plan.for_chunk(129) == [64, 64, 16]
    assert plan.for_decode(17) == [16, 16]
    assert all(sum(plan.for_chunk(n)) >= n for n in range(1, 300))
