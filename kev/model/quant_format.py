"""The quant format's kinds and sizes (cpu_kernels/quant_gemm.cpp reads the same numbers): a leaf that both
quant_weight.py (the packed weight) and kquant.py (K-quant super-blocks) stand on, so neither imports the other back."""
from __future__ import annotations

from enum import IntEnum

BLOCK = 32  # k per quant block
COLS = 16  # output columns per packed cell
SUPER = 256  # k per K-quant super-block (one packed cell of Q4_K / Q5_K / Q6_K)
W8_TILE_K = 64  # k per w8a8 cell (an AMX tile's row of int8)


class Kind(IntEnum):
    """The quant layout (cpu_kernels/quant_gemm.cpp's Kind): Q8 int8 quants (Q8_0, w8a8); Q4 0..15 with w = d·(q - 8)
    (Q4_0); Q4_MIN 0..15 with w = d·q + m (Q4_1)."""

    Q8 = 0
    Q4 = 1
    Q4_MIN = 2
    Q4_K = 3  # K-quants (model/kquant.py): cells of 16 columns × 256 k
    Q5_K = 4
    Q6_K = 5
    W8 = 6  # w8a8 (cpu_kernels/w8a8_gemm.cpp): int8 per output column, one int32 sum over all of K; cells of 16 × 64 k

    @property
    def super_blocks(self) -> bool:
        return self in (Kind.Q4_K, Kind.Q5_K, Kind.Q6_K)
