"""Linear layers whose row results never depend on how many rows share the GEMM.

torch's CPU GEMM picks its blocking from M (the row count), so through `F.linear` the
same row gets different bits at M=1, M=3 or M=40 (shared/notes/batch-invariance-cpu.md).
Three ways out, the first that applies wins; `model/row_invariance.py` checks the result at
start-up:

- *Kev's GEMM* (cpu_kernels/linear_gemm.cpp, CPUs with AVX-512 BF16; fp32 alone on AVX2): every output element is
  one accumulator summed over k in a fixed order, so a row's bits are the same for every M,
  M=1 included — invariant by construction, and faster than oneDNN at every M we measured.
- *free rows*: with weights prepacked once for oneDNN (what inductor's CPU freezing path
  does), every M ≥ 2 runs the same microkernel with the same K blocking, so a row's bits
  are one value whatever M is. The probe checks that for every shape, and then a step is
  one GEMM per layer over all its rows (padded to at least `min_rows`).
- *fixed tiles* (any kernel, any device): rows are multiplied in tiles whose size depends
  only on the row's own question (engine/packer.py's RowTiling).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from kev.model.quant_weight import QuantLinear


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN prepacking exists for CPU fp32 weights, and bf16 ones where oneDNN computes bf16 (AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT: an AVX2-only CPU such as Zen 3 has neither, and the reorder raises there)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16
                                             and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def can_use_kev_gemm(weight: torch.Tensor) -> bool:
    """Kev's GEMM: CPU fp32 / bf16 / int8 weights (bf16 reads k in pairs, int8 two pairs at a time, so K must be
    a multiple of 2 / 4), kernels built with it; an AVX2 build (no AVX-512 BF16) takes fp32 and int8 weights, with
    fp32 activations."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16, torch.int8):
        return False
    if weight.shape[1] % {torch.float32: 1, torch.bfloat16: 2, torch.int8: 4}[weight.dtype]:
        return False
    if not hasattr(torch.ops.kev, "linear_available") or not torch.ops.kev.linear_available():
        return False
    return weight.dtype != torch.bfloat16 or not torch.ops.kev.linear_fp32_only()


class PackedWeight:
    """A weight reordered once into oneDNN's blocked layout (an opaque mkldnn tensor)."""

    kernel = "onednn-prepacked"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows_hint: int) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)
        self.weight, self.bias, self.rows_hint = weight, bias, rows_hint  # the Linear's own (no second copy)

    def __deepcopy__(self, memo: dict[int, object]) -> PackedWeight:
        """A copied model (a tensor-parallel shard) packs its copy of the weight again: an mkldnn tensor has no
        storage to copy."""
        return PackedWeight(copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo), self.rows_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [None], "")


class GemmWeight:
    """A weight packed once for Kev's GEMM: blocks of 16 output columns, k-major inside a block
    (bf16 and int8: k in pairs, as vdpbf16ps reads them); the bias and an int8 weight's scale in fp32,
    padded to whole blocks. The packing is the only copy of the weight Kev keeps (see Linear.prepack)."""

    kernel = "kev-gemm"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None) -> None:
        out_features, in_features = weight.shape
        blocks = -(-out_features // 16)
        padded = F.pad(weight, (0, 0, 0, blocks * 16 - out_features))
        # k-major [blocks, K, 16]: fp32, and int8 for the AVX2 build (which widens each weight to fp32)
        self.k_major = weight.dtype == torch.float32 or bool(torch.ops.kev.linear_fp32_only())
        if self.k_major:
            self.packed = padded.view(blocks, 16, in_features).permute(0, 2, 1).contiguous()
        else:  # [blocks, k pairs, 16 columns, 2]: bf16 as int32 pairs; int8 as below
            pairs = padded.view(blocks, 16, in_features // 2, 2).permute(0, 2, 1, 3)
            if weight.dtype == torch.bfloat16:
                self.packed = pairs.contiguous().view(torch.int32).view(blocks, in_features // 2, 16)
            else:  # sign-magnitude bytes, two pairs' 64 bytes in the order the kernel's byte interleave wants
                grouped = pairs.reshape(blocks, in_features // 4, 2, 4, 8).permute(0, 1, 3, 2, 4)
                self.packed = _sign_magnitude(grouped.contiguous()).view(blocks, in_features // 2, 32)
        self.bias = None if bias is None else F.pad(bias.float(), (0, blocks * 16 - out_features))
        self.scale = None if scale is None else F.pad(scale.float(), (0, blocks * 16 - out_features))
        self.out_features, self.in_features, self.dtype = out_features, in_features, weight.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kev.linear(x.contiguous(), self.packed, self.bias, self.scale, self.out_features)

    def _blocks(self, packed: torch.Tensor) -> torch.Tensor:
        """Packed blocks [n, k steps, ...] as [n, k steps, 16 columns, k per step] in the weight's dtype (int8: the
        bytes, still sign-magnitude; a copy, so pick the blocks first)."""
        blocks, steps = packed.shape[:2]
        if self.dtype == torch.int8 and not self.k_major:
            grouped = packed.view(blocks, steps // 2, 4, 2, 8).permute(0, 1, 3, 2, 4)
            return grouped.reshape(blocks, steps, 16, 2)
        return packed.view(self.dtype).view(blocks, steps, 16, -1)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Weight rows `ids` (an embedding lookup on a tied head), exactly as given to the packing."""
        picked = self._blocks(self.packed[ids // 16])  # [ids, k steps, 16, k per step]: each id's whole block
        picked = picked[torch.arange(ids.numel()), :, ids % 16].reshape(ids.numel(), self.in_features)
        return _from_sign_magnitude(picked) if self.dtype == torch.int8 and not self.k_major else picked

    def unpack(self) -> torch.Tensor:
        """The weight [out_features, in_features] back from the packing."""
        weight = self._blocks(self.packed).permute(0, 2, 1, 3).reshape(-1, self.in_features)[: self.out_features]
        return _from_sign_magnitude(weight) if self.dtype == torch.int8 and not self.k_major else weight.contiguous()


def _sign_magnitude(q: torch.Tensor) -> torch.Tensor:
    """int8 in -127..127 as sign << 7 | magnitude (bytes, viewed as int8)."""
    return torch.where(q < 0, 128 - q.to(torch.int16), q.to(torch.int16)).to(torch.uint8).view(torch.int8)


def _from_sign_magnitude(b: torch.Tensor) -> torch.Tensor:
    magnitude = (b.to(torch.int16) & 0x7F).to(torch.int8)
    return torch.where(b < 0, -magnitude, magnitude)


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, rows_hint: int,
                kev_gemm: bool) -> PackedWeight | GemmWeight | None:
    """The fastest row-invariant packing that applies, or None (F.linear over fixed tiles). kev_gemm: Kev's C++
    kernels are in use (core.kernels: auto and they built). scale: an int8 weight's (oneDNN's path takes none)."""
    if kev_gemm and can_use_kev_gemm(weight):
        return GemmWeight(weight, bias, scale)
    if scale is None and can_prepack(weight):
        return PackedWeight(weight, bias, rows_hint)
    return None


class Linear(nn.Module):
    """y = x Wᵀ + b over row tiles; `tiles` is one entry (the whole step) under free rows.

    Under core.precision int8 the weight is int8 and `scale` (fp32, one per output column) gives
    W ≈ weight · scale (kev/model/quantize.py). The token table is a Linear too: its rows are the
    embeddings, and a tied model's head multiplies by it."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.scale: torch.Tensor | None = None
        self.packed: PackedWeight | GemmWeight | QuantLinear | None = None

    def prepack(self, rows_hint: int, kev_gemm: bool) -> None:
        """Pack for the CPU kernel. Kev's GEMM packing replaces the plain weight (one copy held); packing again
        (another engine on the same model) keeps it, or unpacks it first for another kernel. Quantized blocks
        (core.precision gguf, w8a8) are the only copy and run on their own kernel: kept as they are."""
        if isinstance(self.packed, QuantLinear):
            return
        if isinstance(self.packed, GemmWeight):
            if kev_gemm:
                return
            self.weight.data = self.packed.unpack()
        self.packed = pack_weight(self.weight, self.bias, self.scale, rows_hint, kev_gemm)
        if isinstance(self.packed, GemmWeight):
            self.weight.data = self.weight.data.new_empty(0)
            if self.packed.scale is not None:  # one copy of the scales too: a view of the packing's (padded) ones
                self.scale = self.packed.scale[: self.out_features]

    def forward(self, x: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        # x: [sum(tiles), in_features]; each tile is multiplied on its own.
        multiply = self.packed if self.packed is not None else self._torch_multiply
        if len(tiles) <= 1:
            return multiply(x)
        return torch.cat([multiply(rows) for rows in x.split(tiles)])

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of W in dtype (an embedding lookup): int8 rows times their scale, quantized blocks
        dequantized."""
        if isinstance(self.packed, QuantLinear):
            return self.packed.rows(ids).to(dtype)
        rows = self.packed.rows(ids) if isinstance(self.packed, GemmWeight) else self.weight[ids]
        if self.scale is None:
            return rows.to(dtype)
        return (rows.float() * self.scale[ids, None]).to(dtype)

    def full_weight(self) -> torch.Tensor:
        """W [out, in] in fp32, dequantized and unpacked (a copy: for start-up work such as the router's table)."""
        if isinstance(self.packed, QuantLinear):
            return self.packed.unpack()
        weight = self.packed.unpack() if isinstance(self.packed, GemmWeight) else self.weight
        return weight.float() * self.scale[:, None] if self.scale is not None else weight.float()

    def _torch_multiply(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            return F.linear(x, self.weight, self.bias)
        # int8 without Kev's GEMM (CUDA, or no kernels): int8 -> x's dtype is exact; the scale after the sum.
        out = F.linear(x, self.weight.to(x.dtype)).float() * self.scale
        return (out + self.bias.float() if self.bias is not None else out).to(x.dtype)

