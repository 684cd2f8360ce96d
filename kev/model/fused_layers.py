"""All decoder layers of a step in one C++ call (kernels/decoder_layers.cpp).

The op chains the very kernels the Python layer loop calls (Kev's GEMM, the row ops, rotary with the
KV write, paged attention), in the same order, so a step's bits are the same either way; it only
drops Python's per-op cost, a quarter of a lone question's decode step. It applies to plain
Llama-shaped layers (no family variant) whose linears all run Kev's GEMM or its quantized kernel (uint8 cells,
kernels/quant_gemm.cpp), on steps whose every
row goes to the attention kernel (no long prefill chunk, which needs SDPA)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kev.model.attention import PagedKVLayer
from kev.model.linear import GemmWeight
from kev.model.quant_weight import QuantWeight
from kev.model.step_metadata import StepMetadata

if TYPE_CHECKING:
    from kev.model.llama import LlamaModel


@dataclass(frozen=True)
class FusedLayers:
    weights: list[torch.Tensor]  # per layer: input norm, qkv, o, post-attention norm, gate_up, down
    biases: list[torch.Tensor | None]  # per layer: qkv, o, gate_up, down (fp32, padded) or None
    scales: list[torch.Tensor | None]  # the same for int8 weights' per-column scales
    out_features: list[int]  # qkv, o, gate_up, down
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    @staticmethod
    def build(model: LlamaModel) -> FusedLayers | None:
        """None where some layer is not the plain Llama shape or some linear is not on Kev's GEMM."""
        from kev.model.llama import MLP, Attention, DecoderLayer, RMSNorm

        weights: list[torch.Tensor] = []
        biases: list[torch.Tensor | None] = []
        scales: list[torch.Tensor | None] = []
        out_features: list[int] = []
        eps = 0.0
        for layer in model.layers:
            if not (isinstance(layer, DecoderLayer) and type(layer) is DecoderLayer
                    and type(layer.self_attn) is Attention and type(layer.mlp) is MLP
                    and type(layer.input_layernorm) is RMSNorm and type(layer.post_attention_layernorm) is RMSNorm
                    and layer.self_attn.variant is None):
                return None
            attn, mlp = layer.self_attn, layer.mlp
            packed = [linear.packed for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
            gemms = [p for p in packed if isinstance(p, (GemmWeight, QuantWeight))]
            if len(gemms) != len(packed):
                return None
            qkv, o, gate_up, down = (p.packed if isinstance(p, GemmWeight) else p.cells for p in gemms)
            weights += [layer.input_layernorm.weight, qkv, o, layer.post_attention_layernorm.weight, gate_up, down]
            biases += [p.bias for p in gemms]
            scales += [p.scale for p in gemms]
            out_features = [p.out_features for p in gemms]
            eps = layer.input_layernorm.eps
        cfg = model.config
        return FusedLayers(weights, biases, scales, out_features, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, eps)

    def run(self, x: torch.Tensor, meta: StepMetadata, caches: list[PagedKVLayer], cos: torch.Tensor,
            sin: torch.Tensor) -> torch.Tensor | None:
        """The last layer's pending MLP output (x updated in place), or None when the step needs SDPA."""
        batch = meta.kernel_batch
        if batch is None or meta.long_chunks:
            return None
        return torch.ops.kev.decoder_layers(
            x, self.weights, self.biases, self.scales, [cache.kv for cache in caches], self.out_features, cos, sin,
            meta.positions, meta.token_rows, meta.slot_mapping, meta.padding_rows, batch.rows, batch.kv_slots,
            batch.starts, batch.lengths, self.heads, self.kv_heads, self.head_dim, self.eps, self.head_dim ** -0.5)
