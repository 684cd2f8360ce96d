"""Qwen3: Llama's layer with RMSNorm over each head of q and k before rotary (self_attn.q_norm / k_norm)."""
from __future__ import annotations

from torch import nn

from kev.model.attention import layer_variant
from kev.model.family_attention import FamilyAttention
from kev.model.llama import DecoderLayer, LlamaModel
from kev.model.model_config import ModelConfig


class Qwen3Model(LlamaModel):
    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        return DecoderLayer(cfg, FamilyAttention(cfg, layer_variant(cfg, index, self.max_positions)))
