"""w8a8's two-pass head (model/head_rescoring.py): the first pass's split kernel (outlier channels quantized apart)
gives torch's reference bits on every path that runs it, and the two-pass logits keep every row's maximum and argmax
bit for bit those of the plain int8 head (linear_gemm.cpp), the recomputed blocks with their exact bits, each row
the same alone as in any batch and at 1 or 2 threads."""
from __future__ import annotations

import pytest
import torch

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.head_rescoring import RescoredHead
from kev.model.linear import GemmWeight
from kev.model.model_store import cache_root
from kev.model.quant_weight import W8A8_PATHS, pack_w8a8, reference_w8a8, w8a8_paths
from kev.model.quantize import quantize_rows
from tests.model.row_invariance import assert_rows_invariant

K, VOCAB = 192, 1000  # three 64-k cells; the vocabulary ends in a partial block of 16


@pytest.fixture(scope="module")
def kernels() -> None:
    load_cpu_kernels(cache_root())


def head_inputs(rows: int, seed: int) -> torch.Tensor:
    """Rows with a few large channels, as a model's final hidden states have."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, K, generator=gen)
    x[:, [5, 70, 150]] *= 25
    return x.bfloat16()


def split_weight(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, scale = quantize_rows(torch.randn(VOCAB, K, generator=gen))
    return pack_w8a8(q, scale, torch.randn(VOCAB, generator=gen))


class Split:
    """The first pass as assert_rows_invariant calls it: multiply(x, path) with the split, -1 torch's reference."""

    def __init__(self, w) -> None:
        self.w = w

    def multiply(self, x: torch.Tensor, path: int) -> torch.Tensor:
        if path < 0:
            return reference_w8a8(x, self.w, split=1)
        w = self.w
        return torch.ops.kev.w8a8_linear(x.contiguous(), w.cells, w.scale, w.bias, w.out_features, path, False, 1)


def split_paths() -> list[int]:
    return [W8A8_PATHS[name] for name in w8a8_paths() if name in ("avx512-vnni", "plain")] + [-1]


@pytest.mark.parametrize("rows", [1, 6, 37])
def test_the_split_gives_the_reference_bits_on_every_path_that_runs_it(kernels, rows):
    first = Split(split_weight())
    x = head_inputs(rows, rows)
    want = first.multiply(x, -1)
    for path in split_paths()[:-1]:
        assert torch.equal(first.multiply(x, path), want), f"path {path}"
    assert not torch.equal(want, reference_w8a8(x, first.w))  # two steps, not one: other bits


def test_the_split_rows_are_the_same_at_every_row_count_and_thread_count(kernels):
    assert_rows_invariant(Split(split_weight(1)), head_inputs(40, 2), split_paths())


def test_the_split_is_refused_where_it_does_not_run(kernels):
    w = split_weight()
    with pytest.raises(RuntimeError, match="split"):
        torch.ops.kev.w8a8_linear(head_inputs(2, 0), w.cells, w.scale, None, VOCAB, 2, False, 3)  # K has 3 cells


@pytest.fixture(scope="module")
def two_pass(kernels) -> RescoredHead:
    gen = torch.Generator().manual_seed(7)
    q, scale = quantize_rows(torch.randn(VOCAB, K, generator=gen))
    gemm = GemmWeight(q, None, scale)
    if not RescoredHead.applies_to(gemm):
        pytest.skip("the two-pass head needs Kev's AVX-512 BF16 GEMM and the w8a8 kernel's VNNI path")
    first = head_inputs(256, 8).float().abs().amax(0).topk(64).indices.sort().values
    return RescoredHead(gemm, first)


@pytest.mark.parametrize("path", [1, 2])  # the first pass on VNNI, then on plain C++: the same logits
def test_each_rows_maximum_and_argmax_are_the_plain_heads(two_pass, path):
    x = head_inputs(48, 9)
    x[7] = 0  # tile padding: all logits zero and tied
    plain = two_pass.gemm(x).float()
    got = two_pass(x, path)
    assert torch.equal(got.argmax(1), plain.argmax(1))
    assert torch.equal(got.amax(1), plain.amax(1))
    exact = got == plain
    assert exact.float().mean() < 0.5  # the rest of each row is the first pass's, int8-activation logits
    assert ((got - plain).abs().amax(1) <= 0.1 * plain.abs().amax(1)).all()
    for row, top in enumerate(plain.argmax(1).tolist()):  # the maximum's block recomputed whole, with the exact bits
        assert exact[row, top // 16 * 16: top // 16 * 16 + 16].all(), row
    assert exact[7].all()


def test_two_pass_rows_are_the_same_alone_in_any_batch_and_at_any_thread_count(two_pass):
    x = head_inputs(40, 10)
    full = two_pass(x)
    for rows in (1, 3, 17, 40):
        assert torch.equal(two_pass(x[:rows]), full[:rows]), f"M={rows}"
    assert torch.equal(torch.cat([two_pass(x[r:r + 1]) for r in range(40)]), full)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            assert torch.equal(two_pass(x), full), f"{count} threads"
    finally:
        torch.set_num_threads(threads)
