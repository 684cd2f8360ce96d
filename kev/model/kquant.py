"""GGUF's K-quant blocks (Q4_K, Q5_K, Q6_K) under core.precision gguf: read from the file, packed for
cpu_kernels/quant_gemm.cpp, dequantized back, and the kernel's math in torch ops.

A K-quant super-block covers 256 k of one row: Q4_K / Q5_K hold 8 sub-blocks of 32 quants (0..15 / 0..31), each with
a 6-bit scale sc and a 6-bit min m, and one fp16 d and dmin for the super-block (w = d·sc·q - dmin·m); Q6_K holds 16
sub-blocks of 16 quants (0..63) with an int8 scale each and one fp16 d (w = d·sc·(q - 32)). Packed, a cell is 16
output columns × 256 k: 8 sub-cells of 32 k (the low 4 bits of the quants in the Q4 layout the kernel reads, then
bit 4 (Q5_K) or bits 4-5 (Q6_K), several steps to a byte (_high_bits), then the 16 columns' integer scales and
mins), then the 16 columns' d (and dmin) in fp16: Q4_K 4.625 bits a weight (the file: 4.5), Q5_K 5.625 (5.5),
Q6_K 6.5625 (6.5625).

The math of one output element per 32-k block b (isum_h the exact integer dot product of the quants and the row's int8
activations over 16-k half h, qsum_h the activations' sum there, dx the row's block scale, all as quant_weight.py):
  Q4_K / Q5_K: acc = acc + ((float(isum) · D) - (float(qsum) · M)) · dx,  D = d·sc and M = dmin·m (both exact in
  fp32: an 11-bit fp16 significand times a 6-bit integer), so float(isum)·D is the exact sc·isum rounded once;
  Q6_K: I = sc_0·(isum_0 - 32·qsum_0) + sc_1·(isum_1 - 32·qsum_1), an exact int32 (|I| < 2^24, so float(I) is exact
  too), acc = acc + (float(I) · d) · dx.
Each product and sum is a separately rounded fp32 operation in this order on every path.
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

from kev.model.quant_format import BLOCK, COLS, SUPER, Kind

# Per kind: bytes of one file super-block; (part, bytes) of one packed sub-cell and of the cell's tail.
FILE_BYTES = {Kind.Q4_K: 144, Kind.Q5_K: 176, Kind.Q6_K: 210}
SUB_PARTS = {Kind.Q4_K: [("qs", 256), ("sc", 16), ("m", 16)],
             Kind.Q5_K: [("qs", 256), ("qh", 64), ("sc", 16), ("m", 16)],
             Kind.Q6_K: [("qs", 256), ("qh", 128), ("sc", 32)]}
TAIL_PARTS = {Kind.Q4_K: [("d", 32), ("dmin", 32)], Kind.Q5_K: [("d", 32), ("dmin", 32)], Kind.Q6_K: [("d", 32)]}
K_KINDS = {GGMLQuantizationType.Q4_K: Kind.Q4_K, GGMLQuantizationType.Q5_K: Kind.Q5_K,
           GGMLQuantizationType.Q6_K: Kind.Q6_K}
SUBS = SUPER // BLOCK  # 32-k sub-cells per cell


def cell_bytes(kind: Kind) -> int:
    return SUBS * sum(size for _, size in SUB_PARTS[kind]) + sum(size for _, size in TAIL_PARTS[kind])


# ---- the file's blocks -> per-row arrays ----------------------------------------------------------------------------

def read_k_blocks(kind: Kind, raw: np.ndarray, rows: int, k: int) -> dict[str, np.ndarray]:
    """A tensor's super-blocks (uint8 bytes) as per-row arrays: q [rows, k] (unsigned), sc and m [rows, k/32]
    (Q6_K: sc [rows, k/16] int8, no m), d and dmin fp16 [rows, k/256]."""
    b = np.asarray(raw).reshape(rows, k // SUPER, FILE_BYTES[kind])
    if kind == Kind.Q6_K:
        ql, qh, sc, d = b[..., :128], b[..., 128:192], b[..., 192:208], b[..., 208:210]
        low = np.stack([ql.reshape(rows, -1, 2, 64) & 0xF, ql.reshape(rows, -1, 2, 64) >> 4], axis=-2)  # [.., 2, 2, 64]
        low = low.reshape(rows, -1, 256)  # per 128 k: the 64 bytes' low nibbles, then their high nibbles
        high = np.stack([(qh.reshape(rows, -1, 2, 32) >> s) & 3 for s in (0, 2, 4, 6)], axis=-2).reshape(rows, -1, 256)
        q = low | (high << 4)
        return {"q": q.reshape(rows, k).astype(np.int16), "sc": sc.view(np.int8).reshape(rows, -1).astype(np.int16),
                "d": np.ascontiguousarray(d).view(np.float16).reshape(rows, -1)}
    d, dmin, scales = b[..., 0:2], b[..., 2:4], b[..., 4:16].reshape(rows, -1, 3, 4)
    lo, mn, mixed = scales[..., 0, :], scales[..., 1, :], scales[..., 2, :]
    sc = np.concatenate([lo & 0x3F, (mixed & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    m = np.concatenate([mn & 0x3F, (mixed >> 4) | ((mn >> 2) & 0x30)], axis=-1)
    qs = b[..., 48:] if kind == Kind.Q5_K else b[..., 16:]
    q = np.stack([qs.reshape(rows, -1, 4, 32) & 0xF, qs.reshape(rows, -1, 4, 32) >> 4], axis=-2).reshape(rows, -1, 256)
    if kind == Kind.Q5_K:  # bit j of qh[l] is bit 4 of quant 32·j + l
        qh = b[..., 16:48]
        q = q | np.stack([((qh >> j) & 1) << 4 for j in range(8)], axis=-2).reshape(rows, -1, 256)
    return {"q": q.reshape(rows, k).astype(np.int16), "sc": sc.reshape(rows, -1).astype(np.int16),
            "m": m.reshape(rows, -1).astype(np.int16), "d": np.ascontiguousarray(d).view(np.float16).reshape(rows, -1),
            "dmin": np.ascontiguousarray(dmin).view(np.float16).reshape(rows, -1)}


# ---- per-row arrays -> cells, and back ------------------------------------------------------------------------------

def _per_cell(t: torch.Tensor, blocks: int, per: int) -> torch.Tensor:
    """[rows (padded), n·per] -> [column blocks, n, per·16]: each block's `per` values of its 16 columns."""
    return t.view(blocks, COLS, -1, per).permute(0, 2, 3, 1).reshape(blocks, t.shape[1] // per, per * COLS).contiguous()


def _high_bits(q: torch.Tensor, blocks: int, width: int) -> torch.Tensor:
    """The quants' bits from 4 up (`width` of them: Q5_K 1, Q6_K 2) in the step layout (8 steps × 16 columns × 4 k per
    sub-cell): byte p of a 64-byte vector holds position p (column p // 4, k 4·step + p % 4) of 8 / width steps, step
    s at bits width·s; Q5_K one vector, Q6_K two (steps 0..3, 4..7). One load gives the kernel several steps' high
    bits, each a shift and a mask away."""
    per = 8 // width
    c = ((q >> 4) & ((1 << width) - 1)).view(blocks, COLS, -1, 8, 4).permute(0, 2, 3, 1, 4)
    c = c.reshape(blocks, -1, width, per, 64)
    shifts = (torch.arange(per, dtype=torch.int16) * width).view(per, 1)
    return (c << shifts).sum(-2).to(torch.uint8).reshape(blocks, -1, 64 * width)


def _unhigh_bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of _high_bits: [column blocks, K/32, 64·width] -> [column blocks·16, K] values below 2^width."""
    blocks, kblocks, _ = packed.shape
    per = 8 // width
    b = packed.to(torch.int16).view(blocks, kblocks, width, 1, 64)
    c = (b >> (torch.arange(per, dtype=torch.int16) * width).view(per, 1)) & ((1 << width) - 1)
    return c.reshape(blocks, kblocks, 8, COLS, 4).permute(0, 3, 1, 2, 4).reshape(blocks * COLS, kblocks * BLOCK)


def pack_cells(kind: Kind, parts: dict[str, torch.Tensor], blocks: int, low_nibbles: torch.Tensor) -> torch.Tensor:
    """Cells [column blocks, K/256, cell_bytes(kind)] from padded per-row parts (q, sc, m, d, dmin) and the quants'
    low nibbles already in the Q4 cell layout [column blocks, K/32, 256]."""
    q = parts["q"]
    made = {"qs": low_nibbles}
    if kind != Kind.Q4_K:
        made["qh"] = _high_bits(q, blocks, 1 if kind == Kind.Q5_K else 2)
    if kind == Kind.Q6_K:
        made["sc"] = _per_cell(parts["sc"].to(torch.int8), blocks, 2).view(torch.uint8)
    else:
        made["sc"] = _per_cell(parts["sc"].to(torch.uint8), blocks, 1)
        made["m"] = _per_cell(parts["m"].to(torch.uint8), blocks, 1)
    sub = torch.cat([made[name] for name, _ in SUB_PARTS[kind]], dim=-1)
    supers = q.shape[1] // SUPER
    tail = [_per_cell(parts[name].to(torch.float16), blocks, 1).view(torch.uint8) for name, _ in TAIL_PARTS[kind]]
    return torch.cat([sub.reshape(blocks, supers, -1)] + tail, dim=-1).contiguous()


def cell_part(cells: torch.Tensor, kind: Kind, name: str) -> torch.Tensor:
    """One part of every cell: sub-cell parts [column blocks, K/32, bytes], tail parts [column blocks, K/256, 16]."""
    blocks, supers, _ = cells.shape
    sub_bytes = sum(size for _, size in SUB_PARTS[kind])
    at = 0
    for part, size in SUB_PARTS[kind]:
        if part == name:
            return cells[..., : SUBS * sub_bytes].reshape(blocks, supers * SUBS, sub_bytes)[..., at: at + size]
        at += size
    at = SUBS * sub_bytes
    for part, size in TAIL_PARTS[kind]:
        if part == name:
            return cells[..., at: at + size].contiguous().view(torch.float16)
        at += size
    raise KeyError(name)


def full_quants(cells: torch.Tensor, kind: Kind, low: torch.Tensor) -> torch.Tensor:
    """The quants [out (padded), K] (unsigned) from the low nibbles `low` and the bit planes."""
    if kind == Kind.Q4_K:
        return low
    return low | (_unhigh_bits(cell_part(cells, kind, "qh").contiguous(), 1 if kind == Kind.Q5_K else 2) << 4)


def _rows_of(t: torch.Tensor, per: int) -> torch.Tensor:
    """Inverse of _per_cell: [column blocks, n, per·16] -> [rows (padded), n·per]."""
    blocks, n, _ = t.shape
    return t.reshape(blocks, n, per, COLS).permute(0, 3, 1, 2).reshape(blocks * COLS, n * per)


def scales(cells: torch.Tensor, kind: Kind) -> dict[str, torch.Tensor]:
    """Per-row fp32 factors: D (d·sc, exact) and M (dmin·m) per 32 k, or for Q6_K sc per 16 k and d per 256."""
    sub = SUPER // BLOCK
    d = _rows_of(cell_part(cells, kind, "d"), 1).float()
    if kind == Kind.Q6_K:
        sc = _rows_of(cell_part(cells, kind, "sc").contiguous().view(torch.int8), 2)
        return {"sc": sc.to(torch.int64), "d": d}
    sc = _rows_of(cell_part(cells, kind, "sc"), 1).float()
    m = _rows_of(cell_part(cells, kind, "m"), 1).float()
    dmin = _rows_of(cell_part(cells, kind, "dmin"), 1).float()
    return {"D": sc * d.repeat_interleave(sub, 1), "M": m * dmin.repeat_interleave(sub, 1)}


def dequantize(q: torch.Tensor, kind: Kind, s: dict[str, torch.Tensor]) -> torch.Tensor:
    """W [rows, K] fp32 from unsigned quants and scales(): exactly the values the file's blocks stand for."""
    rows, k = q.shape
    if kind == Kind.Q6_K:
        per16 = s["sc"].float() * s["d"].repeat_interleave(SUPER // 16, 1)  # d·sc: exact
        return (per16[..., None] * (q.float() - 32).view(rows, -1, 16)).reshape(rows, k)
    w = s["D"][..., None] * q.float().view(rows, -1, BLOCK) - s["M"][..., None]
    return w.reshape(rows, k)


# ---- the kernel's math in torch ops ----------------------------------------------------------------------------------

def reference_sums(xq: torch.Tensor, dx: torch.Tensor, q: torch.Tensor, kind: Kind,
                   s: dict[str, torch.Tensor]) -> torch.Tensor:
    """fp32 [rows, out] before bias: xq int8 [rows, K], dx [rows, K/32], q the quants [out, K], s from scales()."""
    rows, kblocks = dx.shape
    out = q.shape[0]
    xh = xq.view(rows, kblocks * 2, 16).to(torch.float64)  # [rows, 16-k halves, 16]
    qh = q.view(out, kblocks * 2, 16).to(torch.float64)
    qsum = xh.sum(-1)  # [rows, halves]
    acc = torch.zeros(rows, out, dtype=torch.float32)
    d = s["d"][:, torch.arange(kblocks) // SUBS] if kind == Kind.Q6_K else None
    for b in range(kblocks):  # one block at a time: the float64 sums stay [rows, out]
        lo, hi = 2 * b, 2 * b + 1
        isum = [xh[:, h] @ qh[:, h].t() for h in (lo, hi)]  # exact integers
        if d is not None:
            sc = s["sc"][:, [lo, hi]].to(torch.float64)  # exact integer arithmetic in float64
            total = sc[:, 0] * (isum[0] - 32 * qsum[:, lo, None]) + sc[:, 1] * (isum[1] - 32 * qsum[:, hi, None])
            f = total.float() * d[:, b]
        else:
            f = (isum[0] + isum[1]).float() * s["D"][:, b] - (qsum[:, lo] + qsum[:, hi]).float()[:, None] * s["M"][:, b]
        acc = acc + f * dx[:, b, None]
    return acc
