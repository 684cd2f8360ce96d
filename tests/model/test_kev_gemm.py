"""Kev's GEMM (kernels/linear_gemm.cpp): the product itself, and a row's bits at every M (1 included),
under any thread count, with and without bias, for shapes whose width is not a multiple of 16."""
from __future__ import annotations

import pytest
import torch

from kev.model.kernels import load_cpu_kernels
from kev.model.linear import GemmWeight, can_use_kev_gemm
from kev.model.model_store import cache_root
from kev.model.row_invariance import probe_data

SHAPES = [(576, 960), (1536, 576), (64, 40), (576, 49152 // 16)]  # (in, out): 40 and 3072 as 16-column tails


@pytest.fixture(scope="module")
def gemm_ready() -> None:
    load_cpu_kernels(cache_root())
    if not can_use_kev_gemm(torch.empty(16, 16, dtype=torch.bfloat16)):
        pytest.skip("Kev's GEMM needs AVX-512 BF16 and the C++ kernels")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_product_matches_fp32_reference(gemm_ready, dtype, shape):
    in_features, out_features = shape
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=gen) * 0.05).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype)
    x = torch.randn(37, in_features, generator=gen).to(dtype)
    got = GemmWeight(weight, bias)(x)
    want = x.float() @ weight.float().T + bias.float()
    assert got.dtype == dtype and got.shape == (37, out_features)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert ((got.float() - want).abs().max() / want.abs().max()).item() < tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_bits_never_depend_on_m(gemm_ready, dtype, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for in_features, out_features in SHAPES[:3]:
            gen = torch.Generator().manual_seed(in_features)
            packed = GemmWeight(torch.randn(out_features, in_features, generator=gen).to(dtype),
                                torch.randn(out_features, generator=gen).to(dtype))
            x = probe_data(80, in_features, 1).to(dtype)  # subnormals, zeros and large values
            reference = packed(x)
            for m in (1, 2, 3, 5, 6, 7, 13, 16, 33, 64, 79):
                for start in range(0, 80 - m + 1, max(m, 7)):
                    assert torch.equal(packed(x[start:start + m]), reference[start:start + m]), (in_features, m, start)
    finally:
        torch.set_num_threads(before)
