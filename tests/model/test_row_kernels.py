"""Kev's C++ row kernels (RMSNorm, rotary in place, SiLU·mul): close to the torch reference, and a
row's bits never depend on the rows beside it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root
from kev.model.rope import RotaryTable

HEADS, KV_HEADS, DIM = 9, 3, 64
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    assert load_cpu_kernels(cache_root()), "Kev's C++ kernels did not build (see the warning above)"


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours.float() - reference.float()).abs().max() / reference.float().abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm(dtype):
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(37, 576, generator=gen).to(dtype), torch.rand(576, generator=gen).to(dtype)
    x32 = x.float()
    reference = weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    ours = torch.ops.kev.rms_norm(x, weight, 1e-5)
    assert relative_error(ours, reference) < TOLERANCE[dtype]
    assert torch.equal(torch.ops.kev.rms_norm(x[11:12].contiguous(), weight, 1e-5)[0], ours[11])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(dtype):
    gate_up = (torch.randn(70, 2 * 1536, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    ours = torch.ops.kev.silu_mul(gate_up)
    assert relative_error(ours, F.silu(gate.float()) * up.float()) < TOLERANCE[dtype]
    assert torch.equal(torch.ops.kev.silu_mul(gate_up[40:41].contiguous())[0], ours[40])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_mul_rounds_the_fp32_result_once(dtype):
    """The 8-column vector steps and the scalar tail (width 8k + 3) convert to the dtype as torch does (nearest
    even, NaN stays NaN), from the same fp32 math as the fp32 kernel."""
    gate_up = (torch.randn(9, 2 * 163, generator=torch.Generator().manual_seed(3)) * 6).to(dtype)
    gate_up[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    rounded_once = torch.ops.kev.silu_mul(gate_up.float()).to(dtype)
    torch.testing.assert_close(torch.ops.kev.silu_mul(gate_up), rounded_once, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_in_place_rotates_q_and_k_only(dtype):
    table = RotaryTable(DIM, 10000.0, None, 512).to(torch.device("cpu"), dtype)
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(23, (HEADS + 2 * KV_HEADS) * DIM, generator=gen).to(dtype)
    positions = torch.randint(0, 512, (23,), generator=gen)
    q_ref = table.apply(qkv[:, :HEADS * DIM].float().view(-1, HEADS, DIM), positions).flatten(1)
    ours = qkv.clone()
    torch.ops.kev.rope_(ours, table.cos, table.sin, positions, HEADS + KV_HEADS, DIM)
    assert relative_error(ours[:, :HEADS * DIM], q_ref) < TOLERANCE[dtype]
    assert torch.equal(ours[:, (HEADS + KV_HEADS) * DIM:], qkv[:, (HEADS + KV_HEADS) * DIM:])  # V untouched
    alone = qkv[7:8].clone()
    torch.ops.kev.rope_(alone, table.cos, table.sin, positions[7:8], HEADS + KV_HEADS, DIM)
    assert torch.equal(alone[0], ours[7])


def test_rope_refuses_a_position_past_its_table():
    table = RotaryTable(DIM, 10000.0, None, 64).to(torch.device("cpu"), torch.float32)
    qkv = torch.zeros(2, (HEADS + 2 * KV_HEADS) * DIM)
    with pytest.raises(RuntimeError, match="position 64 is outside the rotary table"):
        torch.ops.kev.rope_(qkv, table.cos, table.sin, torch.tensor([3, 64]), HEADS + KV_HEADS, DIM)


@pytest.mark.parametrize("n", [1, 5, 16, 17, 100, 49152])
def test_argmax_rows_picks_what_torch_argmax_picks(n):
    """The first of equal maxima, a NaN as the largest (its first), -inf rows, signed zeros, any row length."""
    x = torch.randn(64, n, generator=torch.Generator().manual_seed(n))
    x[3, n // 2] = float("nan")
    x[5] = 7.0
    x[8] = -float("inf")
    x[9] = 0.0
    x[9, n // 3] = -0.0
    if n > 4:
        x[6, 1] = x[6, 4] = 1e9
        x[7, 2] = x[7, n - 1] = float("nan")
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(torch.ops.kev.argmax_rows(x), torch.argmax(x, -1))
    finally:
        torch.set_num_threads(before)
