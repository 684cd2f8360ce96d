"""The start-up row tile probe (fixed tiles on a device whose GEMM picks its kernel by shape, e.g. cuBLAS): it passes
a multiply whose rows are independent and catches one whose rows depend on their neighbours."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kev.model.row_invariance import probe_tiles

weight = torch.randn(24, 32, generator=torch.Generator().manual_seed(0))


def test_tile_probe_passes_independent_rows():
    assert probe_tiles({"w": (32, lambda x: F.linear(x, weight), 64)}, [4, 16], torch.float32, torch.device("cpu"))


def test_tile_probe_catches_rows_that_see_their_neighbours():
    leaky = lambda x: F.linear(x, weight) + 1e-3 * x.mean(0, keepdim=True)[:, :24]  # noqa: E731
    assert not probe_tiles({"w": (32, leaky, 64)}, [4, 16], torch.float32, torch.device("cpu"))
