"""All decoder layers of a step in one C++ call (cpu_kernels/decoder_layers.cpp).

The op chains the very kernels the Python layer loop calls (Kev's GEMM, the row ops, rotary with the
KV write, paged attention), in the same order, so a step's bits are the same either way; it only
drops Python's per-op cost, a quarter of a lone question's decode step. It applies to plain
Llama-shaped layers (no family variant) whose linears all run Kev's GEMM or its quantized kernel (uint8 cells,
cpu_kernels/quant_gemm.cpp), on steps whose every row goes to the row attention kernel (in bf16 with the prefill
kernel: steps without a prompt chunk; a prompt chunk's step is long enough that Python's per-op cost does not
count)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kev.model.attention import PagedKVLayer, prefill_kernel_applies
from kev.model.linear import GemmWeight, Linear
from kev.model.quant_weight import QuantLinear, QuantWeight, quant_parts
from kev.model.step_metadata import StepMetadata

if TYPE_CHECKING:
    from kev.model.llama import LlamaModel


@dataclass(frozen=True)
class LayerParts:
    """One decoder layer as the fused op reads it (DecoderLayer.fusion_parts decides whether it can)."""

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    eps: float
    linears: list[Linear]  # qkv, o, gate_up, down


@dataclass(frozen=True)
class FusedLayers:
    weights: list[torch.Tensor]  # per layer: input norm, qkv, o, post-attention norm, gate_up, down (as their parts)
    parts: list[int]  # per layer: how many parts qkv, o, gate_up and down each have (QuantRows: several)
    biases: list[torch.Tensor | None]  # per linear part (fp32, padded) or None
    scales: list[torch.Tensor | None]  # the same for int8 weights' per-column scales
    out_features: list[int]  # per linear part
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    @staticmethod
    def build(model: LlamaModel) -> FusedLayers | None:
        """None where some layer cannot be fused (its own verdict) or some linear is not on Kev's GEMM."""
        weights: list[torch.Tensor] = []
        parts_of: list[int] = []
        every_part: list[GemmWeight | QuantWeight] = []
        eps = 0.0
        for layer in model.layers:
            says = getattr(layer, "fusion_parts", None)  # a layer that does not say it can be fused is not
            parts: LayerParts | None = says() if says is not None else None
            if parts is None:
                return None
            linears: list[list[GemmWeight | QuantWeight]] = []
            for linear in parts.linears:
                packed = linear.packed
                if isinstance(packed, QuantLinear):
                    linears.append(list(quant_parts(packed)))
                elif isinstance(packed, GemmWeight):
                    linears.append([packed])
                else:
                    return None
            qkv, o, gate_up, down = ([p.packed if isinstance(p, GemmWeight) else p.cells for p in ps] for ps in linears)
            weights += [parts.input_norm, *qkv, *o, parts.post_attention_norm, *gate_up, *down]
            parts_of += [len(ps) for ps in linears]
            every_part += [p for ps in linears for p in ps]
            eps = parts.eps
        cfg = model.config
        return FusedLayers(weights, parts_of, [p.bias for p in every_part], [p.scale for p in every_part],
                           [p.out_features for p in every_part], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, eps)

    def run(self, x: torch.Tensor, meta: StepMetadata, caches: list[PagedKVLayer], cos: torch.Tensor,
            sin: torch.Tensor) -> torch.Tensor | None:
        """The last layer's pending MLP output (x updated in place), or None when the step has prompt rows for the
        prefill kernel."""
        batch = meta.kernel_batch
        prompt_rows = meta.prefill_batch is not None and prefill_kernel_applies(x.dtype, x.device, self.head_dim)
        if batch is None or prompt_rows:
            return None
        return torch.ops.kev.decoder_layers(
            x, self.weights, self.biases, self.scales, [cache.kv for cache in caches], self.parts, self.out_features,
            cos, sin, meta.positions, meta.token_rows, meta.slot_mapping, meta.padding_rows, batch.rows,
            batch.kv_slots, batch.starts, batch.lengths, self.heads, self.kv_heads, self.head_dim, self.eps,
            self.head_dim ** -0.5)
