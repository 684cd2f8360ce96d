"""Phi-3: Llama's layer. Its checkpoints already store qkv_proj and gate_up_proj fused, in Kev's order
(q, k, v; gate, up), so weights.py loads them as they are; partial rotary (Phi-4-mini's 0.75) turns only
the first part of each head, which Llama's fused rotary kernel cannot, so those layers rotate in torch."""
from __future__ import annotations

from torch import nn

from kev.model.attention import layer_variant
from kev.model.family_attention import FamilyAttention
from kev.model.llama import DecoderLayer, LlamaModel
from kev.model.model_config import ModelConfig


class Phi3Model(LlamaModel):
    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        if cfg.rotary_dim == cfg.head_dim:
            return super().make_layer(cfg, index)
        return DecoderLayer(cfg, FamilyAttention(cfg, layer_variant(cfg, index, self.max_positions)))
