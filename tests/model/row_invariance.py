"""The check both quantized-GEMM test files make: a row's bits never depend on the row count or the threads."""
from __future__ import annotations

import torch

from kev.model.quant_weight import QuantWeight


def assert_rows_invariant(w: QuantWeight, x: torch.Tensor, paths: list[str]) -> None:
    """Every M in 1..len(x) and 1 or 2 threads give each row the bits it has in the full product, on every kernel
    path but the last (torch's reference, checked against the kernels by equal-bits tests)."""
    for path in paths[:-1]:
        full = w.multiply(x, path)
        for rows in range(1, len(x) + 1):
            assert torch.equal(w.multiply(x[:rows], path), full[:rows]), f"path {path}, M={rows}"
        threads = torch.get_num_threads()
        try:
            for count in (1, 2):
                torch.set_num_threads(count)
                assert torch.equal(w.multiply(x, path), full), f"path {path}, {count} threads"
        finally:
            torch.set_num_threads(threads)
