"""GGUF's K-quants (Q4_K, Q5_K, Q6_K) on the quantized-activation kernel (model/kquant.py, cpu_kernels/quant_gemm.cpp):
the blocks held stand for exactly the file's weights (against the `gguf` package's dequantize), every instruction-set
path and torch's reference give the same bits, a row's bits are the same at every M in 1..80 and at 1 and 2 threads,
and the product is close to the dequantized weights times x. The `gguf` package cannot quantize to K-quants, so the
files hold random blocks (kev/bench/random_gguf.py: random quants and integer scales, finite fp16 scales)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize

from kev.bench.random_gguf import random_blocks
from kev.model.gguf_weights import read_blocks
from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root
from kev.model.quant_weight import QuantWeight, kernel_paths, reference_linear
from tests.model.row_invariance import assert_rows_invariant

TYPES = [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K]


@pytest.fixture(scope="module")
def paths() -> list[int]:
    """The kernel paths to check, as quant_linear's path numbers (1 AVX-512 VNNI, 2 AVX2), plus -1: torch."""
    load_cpu_kernels(cache_root())
    names = {"avx512-vnni": 1, "avx2": 2, "avx2-vnni": 2}
    return [names[p] for p in kernel_paths()] + [-1]


# Where each K-quant block keeps its quant bits (the rest: fp16 d / dmin and the sub-block scales).
QUANT_BYTES = {GGMLQuantizationType.Q4_K: slice(16, 144), GGMLQuantizationType.Q5_K: slice(16, 176),
               GGMLQuantizationType.Q6_K: slice(0, 192)}


def file_weight(tmp_path: Path, qtype: GGMLQuantizationType, rows: int, cols: int,
                seed: int = 0, largest: bool = False) -> tuple[QuantWeight, torch.Tensor]:
    """A one-tensor GGUF of random `qtype` blocks (largest: every quant at its largest value, 15 / 31 / 63): (Kev's
    weight read from it, gguf's dequantization of the file)."""
    path = tmp_path / f"{qtype.name}-{rows}x{cols}.gguf"
    writer = GGUFWriter(str(path), "llama")
    blocks = random_blocks(qtype, rows, cols, np.random.default_rng(seed))
    if largest:
        by_block = blocks.reshape(rows, cols // 256, -1)
        by_block[..., QUANT_BYTES[qtype]] = 0xFF
    writer.add_tensor("w", blocks, raw_dtype=qtype)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    tensor = GGUFReader(path).tensors[0]
    held = read_blocks(tensor)
    assert held is not None and held.type_name == qtype.name
    weight = held.to_weight()
    weight.bias = torch.randn(weight.cells.shape[0] * 16, generator=torch.Generator().manual_seed(seed))
    return weight, torch.from_numpy(dequantize(tensor.data, qtype).reshape(rows, cols))


@pytest.mark.parametrize("qtype", TYPES)
def test_blocks_are_held_as_the_file_has_them(tmp_path: Path, qtype):
    w, want = file_weight(tmp_path, qtype, 64, 512)
    assert torch.equal(w.unpack(), want)
    ids = torch.tensor([0, 63, 17, 16])
    assert torch.equal(w.rows(ids), want[ids])
    file_bytes = GGUFReader(tmp_path / f"{qtype.name}-64x512.gguf").tensors[0].n_bytes
    assert w.nbytes() - w.bias.numel() * 4 <= 1.03 * file_bytes  # one-time reorder; the file's bytes, d per column


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("shape", [(512, 200), (768, 40)])  # (in, out): partial 16-column blocks
def test_every_path_gives_the_same_bits(tmp_path: Path, paths, qtype, shape):
    w, _ = file_weight(tmp_path, qtype, shape[1], shape[0], seed=1)
    x = (torch.randn(37, shape[0], generator=torch.Generator().manual_seed(1)) * 3).bfloat16()
    results = [w.multiply(x, path) for path in paths]
    for path, got in zip(paths, results):
        assert torch.equal(got, results[0]), f"path {path} differs from path {paths[0]}"


@pytest.mark.parametrize("qtype", TYPES)
def test_the_largest_integer_sums_are_exact(tmp_path: Path, paths, qtype):
    """Every quant at its largest and activations that quantize to +-127 everywhere (all +, all -, then signs that
    follow no pattern): the largest integer sums, where a 16-bit step (AVX2's vpmaddubsw pair sums) would saturate
    or wrap first; every path still gives torch's bits (an exact float64 product)."""
    w, _ = file_weight(tmp_path, qtype, 40, 512, seed=3, largest=True)
    signs = torch.where(torch.rand(6, 512, generator=torch.Generator().manual_seed(3)) < 0.5, -1.0, 1.0)
    x = torch.cat([torch.ones(1, 512), -torch.ones(1, 512), signs]).bfloat16()
    results = [w.multiply(x, path) for path in paths]
    for path, got in zip(paths, results):
        assert torch.equal(got, results[-1]), f"path {path} differs from torch's"


@pytest.mark.parametrize("qtype", TYPES)
def test_rows_are_the_same_at_every_row_count_and_thread_count(tmp_path: Path, paths, qtype):
    w, _ = file_weight(tmp_path, qtype, 200, 512, seed=2)
    x = torch.randn(80, 512, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert_rows_invariant(w, x, paths)


@pytest.mark.parametrize("qtype", TYPES)
def test_the_product_is_close_to_the_dequantized_weights_times_x(tmp_path: Path, qtype):
    w, dense = file_weight(tmp_path, qtype, 96, 1024, seed=3)
    x = torch.randn(16, 1024, generator=torch.Generator().manual_seed(3))
    want = x @ dense.T + w.bias[:96]
    got = reference_linear(x, w)
    assert ((got - want).norm() / want.norm()).item() < 0.02  # int8 activations: ~0.5% typical
