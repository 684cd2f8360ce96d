"""core.precision w8a8's kernel (kernels/w8a8_gemm.cpp, model/quant_weight.py's pack_w8a8): per-column int8 weights
times per-row int8 activations, one int32 sum over all of K. Every path (AMX tiles where the CPU has them, AVX-512
VNNI, AVX2, plain C++) and torch's reference give the same bits, each path forced; a row's bits are the same at every
M in 1..80 and at 1 and 2 threads; the product is close to x times the dequantized weights."""
from __future__ import annotations

import pytest
import torch

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root
from kev.model.quant_weight import W8A8_PATHS, Kind, QuantWeight, pack_w8a8, quantize_per_row, w8a8_paths
from kev.model.quantize import quantize_rows
from tests.model.row_invariance import assert_rows_invariant

# (in, out): K a multiple of 64, or not (the cells pad k with w = 0); out ending in a partial 16-column block.
SHAPES = [(576, 200), (1536, 576), (100, 40)]


@pytest.fixture(scope="module")
def paths() -> list[int]:
    """The kernel paths present here as w8a8_linear's path numbers, then -1: torch's reference."""
    load_cpu_kernels(cache_root())
    return [W8A8_PATHS[name] for name in w8a8_paths()] + [-1]


def random_weight(in_features: int, out_features: int, seed: int = 0) -> QuantWeight:
    gen = torch.Generator().manual_seed(seed)
    q, scale = quantize_rows(torch.randn(out_features, in_features, generator=gen))
    return pack_w8a8(q, scale, torch.randn(out_features, generator=gen))


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def test_every_path_the_cpu_has_is_built(paths):
    names = w8a8_paths()
    if {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_flags():
        assert "avx512-vnni" in names
    if {"avx2", "fma", "f16c"} <= cpu_flags():
        assert "avx2" in names
    if {"amx_tile", "amx_int8"} <= cpu_flags():  # and Linux gave the process the tile state
        assert names[0] == "amx"
    assert names[-1] == "plain"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [1, 5, 16, 37])
def test_every_path_gives_the_same_bits(paths, shape, rows):
    w = random_weight(*shape)
    x = (torch.randn(rows, shape[0], generator=torch.Generator().manual_seed(rows)) * 3).bfloat16()
    results = {path: w.multiply(x, path) for path in paths}
    for path, got in results.items():
        assert torch.equal(got, results[-1]), f"path {path} differs from torch's reference"
    assert torch.equal(w.multiply(x, 0), results[-1])  # the path chosen for this row count


def test_rows_are_the_same_at_every_row_count_and_thread_count(paths):
    w = random_weight(576, 200, seed=1)
    x = torch.randn(80, 576, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert_rows_invariant(w, x, paths)


def test_the_product_is_close_to_x_times_the_dequantized_weights():
    w = random_weight(1536, 576, seed=3)
    x = torch.randn(16, 1536, generator=torch.Generator().manual_seed(3))
    want = x @ w.unpack().T + w.bias[:576]
    got = w.multiply(x, -1)
    assert ((got - want).norm() / want.norm()).item() < 0.02  # per-row int8 activations: ~1% on Gaussian rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_activations_are_quantized_per_row_as_torch_does(paths, dtype):
    x = (torch.randn(9, 100, generator=torch.Generator().manual_seed(4)) * 5).to(dtype)
    x[3] = 0  # an all-zero row: scale 0, quants 0
    q, dx = quantize_per_row(x)
    assert q.abs().max() == 127 and torch.equal(q[3], torch.zeros(100, dtype=torch.int8)) and dx[3] == 0
    assert torch.equal(quantize_per_row(x[5:6])[0], q[5:6])  # a row's quants are its own
    if len(paths) > 1:
        for vector in (True, False):
            kq, kdx = torch.ops.kev.w8a8_quantize(x, vector)
            assert torch.equal(q, kq) and torch.equal(dx, kdx)


def test_packing_round_trips():
    gen = torch.Generator().manual_seed(5)
    q, scale = quantize_rows(torch.randn(40, 100, generator=gen))
    w = pack_w8a8(q, scale)
    assert w.kind == Kind.W8 and w.cells.shape == (3, 2, 1024)
    assert torch.equal(w.unscaled(), q.float())
    assert torch.equal(w.unpack(), q.float() * scale[:, None])
    ids = torch.tensor([0, 39, 17, 16])
    assert torch.equal(w.rows(ids), w.unpack()[ids])
