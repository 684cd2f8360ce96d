"""Block-quantized weights times per-row int8 activations (core.precision gguf and w8a8).

A QuantWeight holds a linear layer's weight as GGUF's Q8_0 / Q4_0 / Q4_1 blocks hold it (32 k per block: quants,
an fp16 scale d, Q4_1 an fp16 min m), or under w8a8 as int8 with one fp32 scale per output column, repacked once
into the layout cpu_kernels/quant_gemm.cpp reads: 16 output columns × 32 k per cell, the same bytes per weight as the
file; or as GGUF's K-quant super-blocks hold it (Q4_K / Q5_K / Q6_K, cells of 16 columns × 256 k: model/kquant.py).
The kernel quantizes each row of x on its own (blocks of 32, as llama.cpp's q8 activations), sums each block's
products exactly in int32 and scales in fp32 in a fixed order; `reference_linear` is the same math in torch ops
(the fallback where the kernels are not built, and the tests' reference), giving the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from kev.model import kquant
from kev.model.quant_format import BLOCK, COLS, SUPER, W8_TILE_K, Kind


def kernel_paths() -> tuple[str, ...]:
    """The kernel's instruction-set paths built on this CPU, best first; () where the kernels are not loaded (yet)."""
    return _built_paths() if hasattr(torch.ops.kev, "quant_linear_paths") else ()


@cache
def _built_paths() -> tuple[str, ...]:
    return tuple(torch.ops.kev.quant_linear_paths())


def active_path() -> str:
    """What QuantWeight runs on: the best kernel path, or torch's ops."""
    paths = kernel_paths()
    return paths[0] if paths else "torch"


def w8a8_paths() -> tuple[str, ...]:
    """w8a8's kernel paths present on this CPU, best first ("amx", "avx512-vnni", "avx2", "plain"); () without the
    kernels."""
    return _w8a8_paths() if hasattr(torch.ops.kev, "w8a8_paths") else ()


@cache
def _w8a8_paths() -> tuple[str, ...]:
    return tuple(torch.ops.kev.w8a8_paths())


W8A8_PATHS = {"avx512-vnni": 1, "plain": 2, "amx": 3, "avx2": 4}  # cpu_kernels/w8a8_gemm.cpp's path numbers


def cell_layout(kind: Kind, has_d: bool) -> list[tuple[str, int]]:
    """The parts of one cell (16 columns × 32 k) in order, with their bytes: the kernel tells layouts apart by the
    sum (cpu_kernels/quant_gemm.cpp's layout_of)."""
    parts = [("qs", 512 if kind == Kind.Q8 else 256)] + ([("d", 32)] if has_d else [])
    return parts + ([("m", 32)] if kind == Kind.Q4_MIN else []) + ([("wsum", 32)] if kind == Kind.Q8 else [])


_VIEWS = {"qs": torch.uint8, "d": torch.float16, "m": torch.float16, "wsum": torch.int16}


@dataclass
class QuantWeight:
    """A packed block-quantized weight; `type_name` is the source format (Q4_1, Q8_0, ..., w8a8)."""

    cells: torch.Tensor  # uint8 [column blocks, K/32, cell bytes] (cell_layout)
    scale: torch.Tensor | None  # fp32 per column, padded (w8a8: the cells have no d)
    bias: torch.Tensor | None  # fp32, padded
    kind: Kind
    out_features: int
    in_features: int
    type_name: str

    @property
    def kernel(self) -> str:
        if self.kind == Kind.W8:
            paths = w8a8_paths()
            return f"kev-w8a8-{paths[0] if paths else 'torch'}"
        return f"kev-quant-{active_path()}"

    def part(self, name: str) -> torch.Tensor | None:
        """One part of every cell, [column blocks, K/32, 16 (d, m, wsum) | bytes (qs)] in its dtype, or None."""
        if self.kind == Kind.W8:
            return self.cells if name == "qs" else None
        if self.kind.super_blocks:
            return kquant.cell_part(self.cells, self.kind, name).contiguous() if name == "qs" else None
        at = 0
        for part, size in cell_layout(self.kind, self.scale is None):
            if part == name:
                view = self.cells[..., at: at + size].contiguous().view(_VIEWS[name])
                return view
            at += size
        return None

    @property
    def qs(self) -> torch.Tensor:
        qs = self.part("qs")
        assert qs is not None
        return qs

    @property
    def d(self) -> torch.Tensor | None:
        return self.part("d")

    @property
    def m(self) -> torch.Tensor | None:
        return self.part("m")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if kernel_paths() and x.device.type == "cpu":  # the kernel rounds to x's dtype as .to() would (ops.h)
            return torch.ops.kev.quant_linear(x.contiguous(), self.cells, self.scale, self.bias, self.out_features, 0,
                                              True)
        return self.multiply(x, -1).to(x.dtype)

    def multiply(self, x: torch.Tensor, path: int) -> torch.Tensor:
        """fp32 [rows, out]: path 0 the best kernel, 1 AVX-512 VNNI, 2 AVX2 (W8: plain C++), 3 AMX (W8), -1 torch's
        ops (the same bits)."""
        if path < 0:
            return reference_w8a8(x, self) if self.kind == Kind.W8 else reference_linear(x, self)
        return torch.ops.kev.quant_linear(x.contiguous(), self.cells, self.scale, self.bias, self.out_features, path)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.cells, self.scale, self.bias) if t is not None]

    def set_bias(self, bias: torch.Tensor) -> None:
        """The bias [out_features], which the kernel adds: fp32, padded to the cells' columns."""
        pad = self.cells.shape[0] * COLS - self.out_features
        self.bias = torch.nn.functional.pad(bias.detach().float(), (0, pad)).contiguous()

    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.tensors())

    def quants(self) -> torch.Tensor:
        """The quants [out (padded to 16), K] as int16 values (Q8: signed; Q4: 0..15)."""
        blocks, kblocks = self.qs.shape[:2]
        if self.kind == Kind.W8:  # [blocks, K/64, 16 steps, 16 columns, 4 k], each w + 128
            q = self.cells.view(blocks, kblocks, 16, COLS, 4).permute(0, 3, 1, 2, 4).reshape(blocks * COLS, -1)
            return q[:, : self.in_features].to(torch.int16) - 128
        if self.kind == Kind.Q8:  # [blocks, kblocks, 8 steps, 16 columns, 4 k]
            q = self.qs.view(torch.int8).view(blocks, kblocks, 8, COLS, 4).permute(0, 3, 1, 2, 4)
            return q.reshape(blocks * COLS, kblocks * BLOCK).to(torch.int16)
        raw = self.qs.view(blocks, kblocks, 4, COLS, 4).to(torch.int16)  # [.., group, column, k]
        q = torch.stack([raw & 0xF, raw >> 4], dim=-2)  # [.., group, column, low/high step, k]
        q = q.permute(0, 3, 1, 2, 4, 5).reshape(blocks * COLS, kblocks * BLOCK)
        if self.kind.super_blocks:
            return kquant.full_quants(self.cells, self.kind, q)
        return q

    def unpack(self) -> torch.Tensor:
        """W [out, in] in fp32, dequantized: exactly the values the file's blocks stand for."""
        if self.kind.super_blocks:
            w = kquant.dequantize(self.quants(), self.kind, kquant.scales(self.cells, self.kind))
            return w[: self.out_features]
        if self.kind == Kind.W8:
            assert self.scale is not None  # w8a8 cells always come with their per-column scale
            return self.unscaled() * self.scale[: self.out_features, None]
        q = self.quants().float()[: self.out_features].view(self.out_features, -1, BLOCK)
        if self.kind == Kind.Q4:
            q = q - 8
        w = q * _per_block(self.d, self.out_features)[..., None] if self.d is not None else q
        if self.m is not None:
            w = w + _per_block(self.m, self.out_features)[..., None]
        w = w.reshape(self.out_features, self.in_features)
        return w * self.scale[: self.out_features, None] if self.scale is not None else w

    def unscaled(self) -> torch.Tensor:
        """w8a8's int8 values [out, in] as fp32, before the per-column scale."""
        return self.quants().float()[: self.out_features]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows `ids` (an embedding lookup): the cells holding them only."""
        picked = QuantWeight(self.cells[ids // COLS], None if self.scale is None else self.scale[: ids.numel() * COLS],
                             None, self.kind, ids.numel() * COLS, self.in_features, self.type_name)
        w = picked.unpack() if self.scale is None else picked.unscaled()
        w = w.view(ids.numel(), COLS, self.in_features)[torch.arange(ids.numel()), ids % COLS]
        return w * self.scale[ids, None] if self.scale is not None else w


@dataclass
class QuantRows:
    """A linear whose output rows come in parts of different block types, each its own QuantWeight: a Q4_K_M file's
    fused q/k/v (Q4_K q and k beside a Q6_K v in some layers). The result is the parts' outputs side by side; a
    column's value depends on its own part alone, so the bits are those of the parts run one by one."""

    parts: list[QuantWeight]

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def type_name(self) -> str:
        return "+".join(p.type_name for p in self.parts)

    @property
    def kernel(self) -> str:
        return self.parts[0].kernel

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def tensors(self) -> list[torch.Tensor]:
        return [t for p in self.parts for t in p.tensors()]

    def unpack(self) -> torch.Tensor:
        return torch.cat([p.unpack() for p in self.parts])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.unpack()[ids]

    def set_bias(self, bias: torch.Tensor) -> None:
        """The linear's bias [out_features] split over the parts (fp32, each padded to its cells)."""
        for part, piece in zip(self.parts, bias.detach().float().split([p.out_features for p in self.parts])):
            part.set_bias(piece)


QuantLinear = QuantWeight | QuantRows  # what a quantized Linear holds


def quant_parts(packed: QuantLinear) -> list[QuantWeight]:
    """A quantized weight's single-type parts: itself, or a QuantRows' parts."""
    return packed.parts if isinstance(packed, QuantRows) else [packed]


def _per_block(t: torch.Tensor, rows: int) -> torch.Tensor:
    """[column blocks, K/32, 16] -> [rows, K/32] fp32."""
    return t.permute(0, 2, 1).reshape(-1, t.shape[1])[:rows].float()


def pack(q: torch.Tensor, d: torch.Tensor | None, m: torch.Tensor | None, kind: Kind, type_name: str,
         scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> QuantWeight:
    """q: [out, in] quant values (Q8: -128..127; Q4: 0..15); d, m: fp16 [out, in/32] (d None: w8a8, with `scale`)."""
    if kind.super_blocks:
        raise ValueError(f"{kind.name} is packed by pack_k")
    out_features, in_features = q.shape
    if in_features % BLOCK:
        raise ValueError(f"quantized weights need in_features a multiple of {BLOCK}, not {in_features}")
    blocks, kblocks = -(-out_features // COLS), in_features // BLOCK
    pad = blocks * COLS - out_features
    wsum = q.to(torch.int16).view(out_features, kblocks, BLOCK).sum(-1) if kind == Kind.Q8 else None
    q = torch.nn.functional.pad(q.to(torch.int16), (0, 0, 0, pad))

    def cells(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:  # [out, K/32] -> cell layout
        if t is None:
            return None
        t = torch.nn.functional.pad(t.to(dtype), (0, 0, 0, pad))
        return t.view(blocks, COLS, kblocks).permute(0, 2, 1).contiguous()

    if kind == Kind.Q8:
        qs = q.to(torch.int8).view(blocks, COLS, kblocks, 8, 4).permute(0, 2, 3, 1, 4).reshape(blocks, kblocks, 512)
        qs = qs.contiguous().view(torch.uint8)
    else:
        qs = _nibbles(q, blocks, kblocks)
    padded = None if scale is None else torch.nn.functional.pad(scale.float(), (0, pad)).contiguous()
    bias_p = None if bias is None else torch.nn.functional.pad(bias.float(), (0, pad)).contiguous()
    parts = {"qs": qs, "d": cells(d, torch.float16), "m": cells(m, torch.float16), "wsum": cells(wsum, torch.int16)}
    layout = [parts[name] for name, _ in cell_layout(kind, d is not None)]
    joined = torch.cat([p.reshape(blocks, kblocks, -1).view(torch.uint8) for p in layout if p is not None], dim=-1)
    return QuantWeight(joined.contiguous(), padded, bias_p, kind, out_features, in_features, type_name)


def pack_w8a8(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> QuantWeight:
    """w8a8: q int8 [out, in] (|q| <= 127) with W ≈ q · scale[:, None], as cpu_kernels/w8a8_gemm.cpp reads it: cells
    [column blocks, ceil(in/64), 1024] of 16 steps × 16 columns × 4 k, each weight as the byte w + 128 (k padded
    with w = 0)."""
    out_features, in_features = q.shape
    blocks, ktiles = -(-out_features // COLS), -(-in_features // W8_TILE_K)
    padded = torch.nn.functional.pad(q.to(torch.int16), (0, ktiles * W8_TILE_K - in_features,
                                                         0, blocks * COLS - out_features))
    cells = (padded + 128).to(torch.uint8).view(blocks, COLS, ktiles, 16, 4).permute(0, 2, 3, 1, 4)
    pad = blocks * COLS - out_features
    return QuantWeight(cells.reshape(blocks, ktiles, 1024).contiguous(),
                       torch.nn.functional.pad(scale.float(), (0, pad)).contiguous(),
                       None if bias is None else torch.nn.functional.pad(bias.float(), (0, pad)).contiguous(),
                       Kind.W8, out_features, in_features, "w8a8")


def quantize_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w8a8's activations, each row with one scale: (q int8 [rows, K], dx fp32 [rows]), dx = max|x| / 127,
    q = round-half-even(x · (1/dx)) — cpu_kernels/w8a8_gemm.cpp's quantization in torch ops."""
    xf = x.float()
    dx = xf.abs().amax(-1) / 127
    inverse = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))
    return torch.round(xf * inverse[:, None]).to(torch.int8), dx


def reference_w8a8(x: torch.Tensor, w: QuantWeight, split: int = 0) -> torch.Tensor:
    """cpu_kernels/w8a8_gemm.cpp's math in torch ops, fp32 [rows, out]: the exact integer sum over all of K (float64
    matmul of small integers is exact: |sum| < 2^31), then (float(isum) · scale[n]) · dx[m] (+ bias[n]), each step
    rounded on its own. split > 0: the first split · 64 columns of x and the rest quantized and summed apart, their
    two terms added."""
    assert w.scale is not None
    weight = w.unscaled().to(torch.float64)
    at = split * W8_TILE_K if split else x.shape[1]
    out = None
    for part, cols in ((x[:, :at], weight[:, :at]), (x[:, at:], weight[:, at:])):
        if part.shape[1] == 0:
            continue
        xq, dx = quantize_per_row(part)
        term = ((xq.to(torch.float64) @ cols.t()).float() * w.scale[: w.out_features]) * dx[:, None]
        out = term if out is None else out + term
    assert out is not None
    return out + w.bias[: w.out_features] if w.bias is not None else out


def _nibbles(q: torch.Tensor, blocks: int, kblocks: int) -> torch.Tensor:
    """Quants 0..15 [out (padded), K] -> the Q4 cell layout [column blocks, K/32, 256]: byte (group, column, i) holds
    k = 8·group + i in its low nibble and k = 8·group + 4 + i in its high one."""
    split = q.view(blocks, COLS, kblocks, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # [.., group, column, k, low/high]
    return (split[..., 0] | (split[..., 1] << 4)).to(torch.uint8).reshape(blocks, kblocks, 256).contiguous()


def pack_k(kind: Kind, parts: dict[str, torch.Tensor], type_name: str) -> QuantWeight:
    """K-quant super-blocks from per-row parts (model/kquant.py's read_k_blocks): q [out, in] unsigned quants, sc,
    m, d, dmin."""
    out_features, in_features = parts["q"].shape
    if in_features % SUPER:
        raise ValueError(f"{type_name} weights need in_features a multiple of {SUPER}, not {in_features}")
    blocks, kblocks = -(-out_features // COLS), in_features // BLOCK
    pad = blocks * COLS - out_features
    padded = {name: torch.nn.functional.pad(t, (0, 0, 0, pad)) for name, t in parts.items()}
    padded["q"] = padded["q"].to(torch.int16)
    cells = kquant.pack_cells(kind, padded, blocks, _nibbles(padded["q"] & 0xF, blocks, kblocks))
    return QuantWeight(cells, None, None, kind, out_features, in_features, type_name)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row in blocks of 32: (q int8 [rows, K], dx fp32 [rows, K/32]), q = round-half-even(x · (1/dx)),
    dx = max|x| / 127 — the kernel's quantization, in torch ops."""
    rows, k = x.shape
    xf = x.float().view(rows, k // BLOCK, BLOCK)
    dx = xf.abs().amax(-1) / 127
    inverse = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))
    q = torch.round(xf * inverse[..., None])
    return q.to(torch.int8).view(rows, k), dx


def reference_linear(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """The kernel's math in torch ops, fp32 [rows, out]: each block's exact integer dot product (float64 matmul of
    small integers is exact), then the fp32 steps in the kernel's order, each rounded on its own."""
    xq, dx = quantize_activations(x)
    rows, kblocks = dx.shape
    if w.kind.super_blocks:
        sums = kquant.reference_sums(xq, dx, w.quants()[: w.out_features], w.kind,
                                     {k: v[: w.out_features] for k, v in kquant.scales(w.cells, w.kind).items()})
        return sums + w.bias[: w.out_features] if w.bias is not None else sums
    xb = xq.view(rows, kblocks, BLOCK).to(torch.float64).permute(1, 0, 2)  # [kblocks, rows, 32]
    q = w.quants()[: w.out_features].view(w.out_features, kblocks, BLOCK).to(torch.float64).permute(1, 2, 0)
    isum = torch.bmm(xb, q)  # [kblocks, rows, out]: integers
    qsum = xb.sum(-1)  # [kblocks, rows]
    if w.kind == Kind.Q4:
        isum = isum - 8 * qsum[..., None]
    d = _per_block(w.d, w.out_features) if w.d is not None else None
    m = _per_block(w.m, w.out_features) if w.m is not None else None
    sx = dx * qsum.t().float()
    acc = torch.zeros(rows, w.out_features, dtype=torch.float32, device=x.device)
    for b in range(kblocks):
        f = isum[b].float()
        if d is not None:
            f = f * d[:, b]
        acc = acc + f * dx[:, b, None]
        if m is not None:
            acc = acc + m[:, b] * sx[:, b, None]
    if w.scale is not None:
        acc = acc * w.scale[: w.out_features]
    return acc + w.bias[: w.out_features] if w.bias is not None else acc
