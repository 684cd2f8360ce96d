"""The start-up probe decides between one GEMM per step and fixed tiles: it must catch a kernel whose
rows change with M, including a difference that only shows on some data."""
from __future__ import annotations

import torch

from kev.engine.packer import RowTiling
from kev.model.linear import PackedWeight, can_prepack
from kev.model.row_invariance import RowInvariance, probe, probe_data, probe_sizes

CPU = torch.device("cpu")


def exact(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0  # row-wise, the same bits at every M


def test_a_row_wise_kernel_is_free_from_one_row(tmp_path):
    verdict = probe({"double": (8, exact, 100)}, torch.float32, CPU, tmp_path, "exact")
    assert verdict == RowInvariance(True, 1, 100)


def test_a_kernel_whose_single_row_differs_pads_to_two(tmp_path):
    def single_row_path(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 + (1e-3 if x.shape[0] == 1 else 0.0)

    verdict = probe({"m1": (8, single_row_path, 100)}, torch.float32, CPU, tmp_path, "m1")
    assert verdict.free_rows and verdict.min_rows == 2


def test_a_kernel_that_changes_with_m_falls_back_to_tiles(tmp_path):
    def blocked(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 + (1e-3 if x.shape[0] > 40 else 0.0)

    verdict = probe({"blocked": (8, blocked, 100)}, torch.float32, CPU, tmp_path, "blocked")
    assert not verdict.free_rows
    assert verdict.label == "fixed-tiles"


def test_a_difference_on_subnormals_only_is_caught(tmp_path):
    def flushes_when_alone(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:  # one path flushes subnormal inputs to zero, as AVX512-BF16's dot product does
            x = torch.where(x.abs() < torch.finfo(x.dtype).tiny, torch.zeros_like(x), x)
        return x * 1e30

    verdict = probe({"ftz": (64, flushes_when_alone, 64)}, torch.float32, CPU, tmp_path, "ftz")
    assert verdict.min_rows == 2


def test_the_verdict_is_cached(tmp_path):
    calls = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x * 2.0

    first = probe({"c": (8, counted, 64)}, torch.float32, CPU, tmp_path, "cached")
    made = len(calls)
    assert probe({"c": (8, counted, 64)}, torch.float32, CPU, tmp_path, "cached") == first
    assert len(calls) == made and list(tmp_path.glob("*.json"))


def test_probe_sizes_cover_small_m_and_the_limit():
    sizes = probe_sizes(512)
    assert sizes[:64] == list(range(1, 65)) and 512 in sizes and 127 in sizes and 129 in sizes


def test_probe_data_has_subnormals_zeros_and_large_values():
    x = probe_data(64, 256, 0)
    assert (x == 0).any() and (x.abs() > 100).any()
    assert ((x != 0) & (x.abs() < torch.finfo(torch.float32).tiny)).any()


def test_prepacked_weights_give_the_bits_of_their_verdict():
    """The real kernel on the default model's shapes: under the probe's verdict, a row's bits are the same
    in every GEMM size the packer can produce."""
    weight = torch.randn(1536, 576).to(torch.bfloat16)
    if not can_prepack(weight):
        return
    packed = PackedWeight(weight, None, 16)
    verdict = probe({"w": (576, packed, 96)}, torch.bfloat16, CPU, None, "test")
    if not verdict.free_rows:
        return  # this CPU needs fixed tiles; tests/model/test_linear.py covers them
    plan = RowTiling(16, 64, free_rows=True, min_rows=verdict.min_rows)
    x = probe_data(96, 576, 1).to(torch.bfloat16)
    alone = packed(torch.cat([x[5:6], x.new_zeros(plan.for_step(1)[0] - 1, 576)]))[0]
    for rows in (7, 33, 96):
        assert torch.equal(packed(x[:rows])[5], alone)
