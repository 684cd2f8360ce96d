"""A persistent Triton GEMM with one fixed tile config and no split-K: y = x Wᵀ (+ bias).

Each output element is one fp32 accumulator summed over k in BLOCK_K steps, left to right, whatever M is: a row's bits
never depend on how many rows share the call, so a step can be one GEMM over all its rows (no row tiles). Programs
walk output tiles in a fixed stride (persistent: about one program per SM); which program computes a tile changes
nothing in its sums. On CUDA it is the alternative to cuBLAS with fixed row tiles (core.gpu_linear), chosen by
measurement on the device (bench/gpu.sh); the start-up row probe checks it as it checks every kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 64, 128, 64  # the one tile config (never chosen by M: that would move K's order)


@triton.jit
def _persistent_gemm_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, num_programs, HAS_BIAS: tl.constexpr,
                            IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for tile in range(tl.program_id(0), num_tiles, num_programs):
        rows = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k in range(0, K, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + ks[None, :],
                        mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
            b = tl.load(w_ptr + cols[None, :].to(tl.int64) * K + ks[:, None],
                        mask=(cols[None, :] < N) & (ks[:, None] < K), other=0.0)
            if IEEE:  # fp32 inputs: true fp32 products (not TF32)
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


def num_programs(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter (tests): a few programs still exercise the persistent loop


class TritonGemmWeight:
    """A Linear's multiply by the persistent GEMM (set as Linear.packed: Linear calls it on its rows)."""

    kernel = "triton-persistent-gemm"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight.contiguous(), bias
        self.programs = num_programs(weight.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return persistent_linear(x, self.weight, self.bias, self.programs)


def persistent_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      programs: int | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K]. Returns [M, N] in x's dtype."""
    x = x.contiguous()
    (m, k), n = x.shape, weight.shape[0]
    y = x.new_empty(m, n)
    if m == 0:
        return y
    programs = programs or num_programs(x.device)
    tiles = triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    grid = min(programs, tiles)
    _persistent_gemm_kernel[(grid,)](x, weight, bias if bias is not None else x, y, m, n, k, grid,
                                     HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M,
                                     BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y
