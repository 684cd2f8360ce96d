"""core.precision gguf: a GGUF's own block-quantized weights, held as the file has them.

Each linear weight of type Q8_0, Q4_0 or Q4_1 becomes a QuantWeight (model/quant_weight.py): the same quants and
fp16 scales (and mins), repacked for the kernel, about the file's bytes. Rows of q and k are unpermuted and the
q/k/v and gate/up parts concatenated by rows, which moves whole blocks and changes no value. A tensor of another
type (Q4_K, Q6_K, F16, ...) is dequantized to the compute dtype with a one-line notice naming it, and so is a fused
weight whose parts differ in type. Norms are read as the file has them (F32).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from torch import nn

from kev.model.gguf_convert import _dequantize, hf_name, unpermute
from kev.model.linear import Linear
from kev.model.quant_weight import BLOCK, Kind, QuantWeight, pack

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

Blocks = tuple[Kind, str, np.ndarray, np.ndarray, np.ndarray | None]  # kind, type name, q [N, K], d, m [N, K/32]


def read_blocks(t: ReaderTensor) -> Blocks | None:
    """A tensor's quants and scales per row, or None where its type is not one the kernel holds."""
    spec = _BLOCKS.get(t.tensor_type)
    if spec is None or len(t.shape) != 2:
        return None
    kind, size, has_min = spec
    rows, k = int(t.shape[1]), int(t.shape[0])
    cells = np.asarray(t.data).reshape(rows, k // BLOCK, size)
    d = np.ascontiguousarray(cells[..., :2]).view(np.float16)[..., 0]
    m = np.ascontiguousarray(cells[..., 2:4]).view(np.float16)[..., 0] if has_min else None
    raw = cells[..., 4 if has_min else 2:]
    if kind == Kind.Q8:
        q = np.ascontiguousarray(raw).view(np.int8).astype(np.int16)
    else:  # byte j holds k = j (low nibble) and k = j + 16 (high nibble)
        q = np.concatenate([raw & 0xF, raw >> 4], axis=-1).astype(np.int16)
    return kind, t.tensor_type.name, q.reshape(rows, k), d, m


def _unpermute_blocks(b: Blocks, heads: int) -> Blocks:
    kind, name, q, d, m = b
    return kind, name, unpermute(q, heads), unpermute(d, heads), None if m is None else unpermute(m, heads)


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
            blocks[name] = held if heads is None else _unpermute_blocks(held, heads)
            continue
        if len(t.shape) == 2:
            log.info("GGUF tensor %s is %s: dequantized to the compute dtype (core.precision gguf holds Q8_0, Q4_0 "
                     "and Q4_1 blocks)", t.name, t.tensor_type.name)
        w = _dense(t)
        dense[name] = torch.from_numpy(np.array(unpermute(w, heads) if heads is not None else w))
    return dense, blocks


def _fuse(name: str, parts: list[str], dense: dict[str, torch.Tensor], blocks: dict[str, Blocks]) -> None:
    """Concatenate the parts of a fused linear by rows: in blocks where all parts share one type, else dense."""
    held = [blocks.get(p) for p in parts]
    if all(h is not None for h in held) and len({h[0] for h in held if h is not None}) == 1:
        got = [h for h in held if h is not None]
        m = None if got[0][4] is None else np.concatenate([h[4] for h in got if h[4] is not None])
        blocks[name] = (got[0][0], got[0][1], np.concatenate([h[2] for h in got]), np.concatenate([h[3] for h in got]),
                        m)
    else:
        for p, h in zip(parts, held):
            if h is not None:
                log.info("GGUF weight %s is %s but its fused neighbours differ: dequantized to the compute dtype",
                         p, h[1])
                dense[p] = dequantized(h)
        dense[name] = torch.cat([dense.pop(p) for p in parts])
    for p in parts:
        blocks.pop(p, None)


def dequantized(b: Blocks) -> torch.Tensor:
    kind, _, q, d, m = b
    w = (q.astype(np.float32) - (8 if kind == Kind.Q4 else 0)).reshape(q.shape[0], -1, BLOCK)
    w = w * d.astype(np.float32)[..., None] + (0 if m is None else m.astype(np.float32)[..., None])
    return torch.from_numpy(w.reshape(q.shape))


def attach_gguf(model: nn.Module, path: Path, num_layers: int, n_head: int, n_kv: int,
                tied: bool) -> dict[str, torch.Tensor]:
    """Give every Linear of `model` its GGUF blocks (emptying its weight); returns the other tensors (fp32) for
    load_state_dict, Kev's fused names."""
    dense, blocks = read_gguf(path, n_head, n_kv)
    for layer in range(num_layers):
        for fused, parts in _FUSED.items():
            prefix = f"layers.{layer}."
            for suffix in (".weight", ".bias"):
                names = [prefix + p + suffix for p in parts]
                if any(n in dense or n in blocks for n in names):
                    _fuse(prefix + fused + suffix, names, dense, blocks)
    if tied:
        dense.pop("lm_head.weight", None)
        blocks.pop("lm_head.weight", None)
    for name, module in model.named_modules():
        key = name + ".weight"
        if isinstance(module, Linear) and key in blocks:
            kind, type_name, q, d, m = blocks.pop(key)
            module.packed = pack(torch.from_numpy(q), torch.from_numpy(d),
                                 None if m is None else torch.from_numpy(m), kind, type_name)
            module.weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    return dense


def finish_quant_biases(model: nn.Module) -> None:
    """A quantized linear's bias (fp32, padded) goes with its blocks, which the kernel adds."""
    for module in model.modules():
        if isinstance(module, Linear) and isinstance(module.packed, QuantWeight) and module.bias is not None:
            pad = module.packed.cells.shape[0] * 16 - module.out_features
            module.packed.bias = nn.functional.pad(module.bias.detach().float(), (0, pad)).contiguous()
