"""Kev's GEMM (cpu_kernels/linear_gemm.cpp): the product itself, and a row's bits at every M (1 included),
under any thread count, with and without bias, for shapes whose width is not a multiple of 16; in fp32,
bf16 and int8 (weight-only, per-column scale), and the packing's way back (unpack, embedding rows)."""
from __future__ import annotations

import pytest
import torch

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.linear import GemmWeight, can_use_kev_gemm
from kev.model.model_store import cache_root
from kev.model.quantize import quantize_rows
from kev.model.row_invariance import probe_data

SHAPES = [(576, 960), (1536, 576), (64, 40), (576, 49152 // 16)]  # (in, out): 40 and 3072 as 16-column tails


@pytest.fixture(scope="module")
def kernels() -> None:
    load_cpu_kernels(cache_root())


@pytest.fixture
def gemm_ready(kernels, request) -> None:
    """Skips a test whose weight dtype (its `dtype` parameter, else bf16 / int8) this build's GEMM does not take:
    an AVX2 build takes fp32 only."""
    dtype = request.node.callspec.params.get("dtype", torch.bfloat16) if hasattr(request.node, "callspec") \
        else torch.bfloat16
    if not can_use_kev_gemm(torch.empty(16, 16, dtype=dtype)):
        pytest.skip(f"Kev's GEMM takes no {dtype} weights here (bf16 and int8 need AVX-512 BF16)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_product_matches_fp32_reference(gemm_ready, dtype, shape):
    in_features, out_features = shape
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=gen) * 0.05).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype)
    x = torch.randn(37, in_features, generator=gen).to(dtype)
    got = GemmWeight(weight, bias, None)(x)
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
                                torch.randn(out_features, generator=gen).to(dtype), None)
            x = probe_data(80, in_features, 1).to(dtype)  # subnormals, zeros and large values
            reference = packed(x)
            for m in (1, 2, 3, 5, 6, 7, 13, 16, 33, 64, 79):
                for start in range(0, 80 - m + 1, max(m, 7)):
                    assert torch.equal(packed(x[start:start + m]), reference[start:start + m]), (in_features, m, start)
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def int8_rows(kernels) -> torch.dtype:
    """The activation dtype int8 weights run with: bf16 on AVX-512 BF16, fp32 on an AVX2 build."""
    if not can_use_kev_gemm(torch.empty(16, 16, dtype=torch.int8)):
        pytest.skip("Kev's GEMM takes no int8 weights here")
    return torch.float32 if torch.ops.kev.linear_fp32_only() else torch.bfloat16


def int8_weight(shape: tuple[int, int], seed: int, bias: bool = True) -> tuple[GemmWeight, torch.Tensor, torch.Tensor,
                                                                               torch.Tensor | None]:
    in_features, out_features = shape
    gen = torch.Generator().manual_seed(seed)
    q, scale = quantize_rows(torch.randn(out_features, in_features, generator=gen) * 0.05)
    b = torch.randn(out_features, generator=gen) if bias else None
    return GemmWeight(q, b, scale), q, scale, b


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_product_is_the_scaled_integer_product(int8_rows, shape):
    packed, q, scale, bias = int8_weight(shape, 1)
    x = torch.randn(37, shape[0], generator=torch.Generator().manual_seed(2)).to(int8_rows)
    want = (x.float() @ q.float().T) * scale + bias
    for rows in (1, 2, 5, 37):  # in registers (<= 6 rows) and through the widened panel
        got = packed(x[:rows])
        assert got.dtype == int8_rows
        assert ((got.float() - want[:rows]).abs().max() / want.abs().max()).item() < 1e-2


@pytest.mark.parametrize("threads", [1, 2])
def test_int8_rows_bits_never_depend_on_m_and_match_float_integers(int8_rows, threads):
    """int8 runs the float kernel's very sum on the widened integers (bf16's on AVX-512, fp32's on AVX2): a row's
    bits equal that kernel's on q as floats (then × scale)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in SHAPES[:3]:
            packed, q, scale, _ = int8_weight(shape, shape[0], bias=False)
            x = probe_data(80, shape[0], 1).to(int8_rows)
            reference = packed(x)
            unit = GemmWeight(q, None, torch.ones_like(scale))  # × 1.0 is exact: the sum itself shows
            assert torch.equal(unit(x), GemmWeight(q.to(int8_rows), None, None)(x))
            for m in (1, 2, 3, 4, 5, 6, 7, 13, 16, 33, 64, 79):
                for start in range(0, 80 - m + 1, max(m, 7)):
                    assert torch.equal(packed(x[start:start + m]), reference[start:start + m]), (shape, m, start)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_the_packing_gives_the_weight_back(gemm_ready, dtype):
    in_features, out_features = 64, 40
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(3))
    weight = quantize_rows(weight)[0] if dtype == torch.int8 else weight.to(dtype)
    packed = GemmWeight(weight, None, torch.ones(out_features) if dtype == torch.int8 else None)
    assert torch.equal(packed.unpack(), weight)
    ids = torch.tensor([0, 15, 16, 39, 7])
    assert torch.equal(packed.rows(ids), weight[ids])
