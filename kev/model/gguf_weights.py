"""core.precision gguf: a GGUF's own block-quantized weights, held as the file has them.

Each linear weight of type Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K becomes a QuantWeight (model/quant_weight.py,
model/kquant.py): the same quants and scales (and mins), repacked for the kernel, about the file's bytes. Rows of q
and k are unpermuted and the q/k/v and gate/up parts concatenated by rows, which moves whole blocks and changes no
value; a fused weight whose parts differ in type (a Q4_K_M file's Q6_K v beside Q4_K q and k) is held as row parts,
one QuantWeight per run of one type (QuantRows). A tensor of another type (Q5_0, Q2_K, F16, ...) is dequantized to
the compute dtype with a one-line notice naming it, and so is a fused weight with such a part. Norms are read as the
file has them (F32).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from itertools import groupby
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from torch import nn

from kev.model.gguf_convert import _dequantize, hf_name, unpermute
from kev.model import kquant
from kev.model.linear import Linear
from kev.model.quant_weight import BLOCK, Kind, QuantLinear, QuantRows, QuantWeight, pack, pack_k

log = logging.getLogger("kev.model")

# GGUF type -> (kernel layout, bytes per block of 32, whether the block has a min after its scale)
_BLOCKS: dict[GGMLQuantizationType, tuple[Kind, int, bool]] = {
    GGMLQuantizationType.Q8_0: (Kind.Q8, 34, False),
    GGMLQuantizationType.Q4_0: (Kind.Q4, 18, False),
    GGMLQuantizationType.Q4_1: (Kind.Q4_MIN, 20, True),
}
_FUSED = {  # Kev's fused linears: (fused name, HF parts in order)
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}



@dataclass
class Blocks:
    """A weight's blocks as per-row arrays: q [N, K] and its scales (Q8_0 / Q4_0 / Q4_1: d, m [N, K/32]; K-quants:
    kquant.read_k_blocks's parts). Every part has one row per output row, so rows move with their blocks."""

    kind: Kind
    type_name: str
    parts: dict[str, np.ndarray]

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> Blocks:
        return Blocks(self.kind, self.type_name, {name: fn(a) for name, a in self.parts.items()})

    def to_weight(self) -> QuantWeight:
        t = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in self.parts.items()}
        if self.kind.super_blocks:
            return pack_k(self.kind, t, self.type_name)
        return pack(t["q"], t["d"], t.get("m"), self.kind, self.type_name)


def read_blocks(t: ReaderTensor) -> Blocks | None:
    """A tensor's quants and scales per row, or None where its type is not one the kernel holds."""
    if len(t.shape) != 2:
        return None
    rows, k = int(t.shape[1]), int(t.shape[0])
    if t.tensor_type in kquant.K_KINDS:
        kind = kquant.K_KINDS[t.tensor_type]
        return Blocks(kind, t.tensor_type.name, kquant.read_k_blocks(kind, np.asarray(t.data), rows, k))
    spec = _BLOCKS.get(t.tensor_type)
    if spec is None:
        return None
    kind, size, has_min = spec
    cells = np.asarray(t.data).reshape(rows, k // BLOCK, size)
    d = np.ascontiguousarray(cells[..., :2]).view(np.float16)[..., 0]
    m = np.ascontiguousarray(cells[..., 2:4]).view(np.float16)[..., 0] if has_min else None
    raw = cells[..., 4 if has_min else 2:]
    if kind == Kind.Q8:
        q = np.ascontiguousarray(raw).view(np.int8).astype(np.int16)
    else:  # byte j holds k = j (low nibble) and k = j + 16 (high nibble)
        q = np.concatenate([raw & 0xF, raw >> 4], axis=-1).astype(np.int16)
    parts = {"q": q.reshape(rows, k), "d": d} | ({} if m is None else {"m": m})
    return Blocks(kind, t.tensor_type.name, parts)


def _dense(t: ReaderTensor) -> np.ndarray:
    shape = tuple(reversed([int(d) for d in t.shape]))
    return np.ascontiguousarray(_dequantize(t), dtype=np.float32).reshape(shape)


def read_gguf(path: Path, n_head: int, n_kv: int) -> tuple[dict[str, torch.Tensor], dict[str, Blocks]]:
    """(tensors dequantized to fp32, linear weights kept in blocks), under Kev's unfused HF-style names."""
    reader = GGUFReader(path)
    dense: dict[str, torch.Tensor] = {}
    blocks: dict[str, Blocks] = {}
    for t in reader.tensors:
        name, heads = hf_name(t.name, n_head, n_kv)
        name = name.removeprefix("model.")
        held = read_blocks(t) if name.endswith(".weight") else None
        if held is not None:
            blocks[name] = held if heads is None else held.map(partial(unpermute, n_head=heads))
            continue
        if len(t.shape) == 2:
            log.info("GGUF tensor %s is %s: dequantized to the compute dtype (core.precision gguf holds Q8_0, Q4_0, "
                     "Q4_1, Q4_K, Q5_K and Q6_K blocks)", t.name, t.tensor_type.name)
        w = _dense(t)
        dense[name] = torch.from_numpy(np.array(unpermute(w, heads) if heads is not None else w))
    return dense, blocks


def _fuse(name: str, parts: list[str], dense: dict[str, torch.Tensor], blocks: dict[str, Blocks],
          mixed: dict[str, list[Blocks]]) -> None:
    """Concatenate the parts of a fused linear by rows: in blocks where all parts share one type; where all are held
    but types differ, as row parts of each run of one type (`mixed`); else dense."""
    held = [blocks.get(p) for p in parts]
    got = [h for h in held if h is not None]
    if len(got) == len(held) and len({h.kind for h in got}) > 1:
        runs = [list(run) for _, run in groupby(got, key=lambda h: h.kind)]
        mixed[name] = [_concat(run) for run in runs]
    elif len(got) == len(held):
        blocks[name] = _concat(got)
    else:
        for p, h in zip(parts, held):
            if h is not None:
                log.info("GGUF weight %s is %s but a fused neighbour is not held in blocks: dequantized to the compute "
                         "dtype",
                         p, h.type_name)
                dense[p] = dequantized(h)
        dense[name] = torch.cat([dense.pop(p) for p in parts])
    for p in parts:
        blocks.pop(p, None)


def _concat(held: list[Blocks]) -> Blocks:
    """Blocks of one type stacked by rows (whole blocks move; no value changes)."""
    return Blocks(held[0].kind, held[0].type_name,
                  {part: np.concatenate([h.parts[part] for h in held]) for part in held[0].parts})


def dequantized(b: Blocks) -> torch.Tensor:
    if b.kind.super_blocks:
        return b.to_weight().unpack()
    q, d, m = b.parts["q"], b.parts["d"], b.parts.get("m")
    w = (q.astype(np.float32) - (8 if b.kind == Kind.Q4 else 0)).reshape(q.shape[0], -1, BLOCK)
    w = w * d.astype(np.float32)[..., None] + (0 if m is None else m.astype(np.float32)[..., None])
    return torch.from_numpy(w.reshape(q.shape))


def attach_gguf(model: nn.Module, path: Path, num_layers: int, n_head: int, n_kv: int,
                tied: bool) -> dict[str, torch.Tensor]:
    """Give every Linear of `model` its GGUF blocks (emptying its weight); returns the other tensors (fp32) for
    load_state_dict, Kev's fused names."""
    dense, blocks = read_gguf(path, n_head, n_kv)
    mixed: dict[str, list[Blocks]] = {}
    for layer in range(num_layers):
        for fused, parts in _FUSED.items():
            prefix = f"layers.{layer}."
            for suffix in (".weight", ".bias"):
                names = [prefix + p + suffix for p in parts]
                if any(n in dense or n in blocks for n in names):
                    _fuse(prefix + fused + suffix, names, dense, blocks, mixed)
    if tied:
        dense.pop("lm_head.weight", None)
        blocks.pop("lm_head.weight", None)
    for name, module in model.named_modules():
        key = name + ".weight"
        if isinstance(module, Linear) and (key in blocks or key in mixed):
            module.packed = blocks.pop(key).to_weight() if key in blocks else \
                QuantRows([b.to_weight() for b in mixed.pop(key)])
            module.weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    return dense


def finish_quant_biases(model: nn.Module) -> None:
    """A quantized linear's bias goes with its blocks, which the kernel adds."""
    for module in model.modules():
        if isinstance(module, Linear) and isinstance(module.packed, QuantLinear) and module.bias is not None:
            module.packed.set_bias(module.bias)
