"""Gemma 2 and 3: GeGLU, embeddings scaled by sqrt(hidden), (1 + w) RMSNorms (four per layer), attention
scaled by query_pre_attn_scalar, sliding-window attention on some layers. Gemma 2 soft-caps attention scores
and final logits with tanh; Gemma 3 (text) normalises q and k per head instead and gives its sliding layers
their own rotary base.

Gemma's norm computes x̂ · (1 + w) in fp32; weights.py folds the 1 into the weight at load, in fp32
before any cast (fold_norm_weights), so the norm is Llama's RMSNorm and, in fp32, the same bits.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kev.model.attention import PagedKVLayer, layer_variant
from kev.model.family_attention import FamilyAttention
from kev.model.llama import MLP, LlamaModel, RMSNorm
from kev.model.model_config import ModelConfig
from kev.model.rope import RotaryTable
from kev.model.step_metadata import StepMetadata


def fold_norm_weights(state: dict[str, torch.Tensor]) -> None:
    """w -> 1 + w for every RMSNorm weight (fp32, in place in the state dict)."""
    for name in state:
        if name.endswith("norm.weight"):
            state[name] = 1.0 + state[name].float()


class GegluMLP(MLP):
    """gelu_tanh(gate) · up; Kev's fused SiLU·mul kernel does not apply, so `fused` is ignored."""

    def forward(self, x: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        if self.device_ops is not None:  # Kev's Triton GeGLU (LlamaModel.use_device_kernels)
            return self.down_proj(self.device_ops.gated(self.gate_up_proj(x, tiles), True), tiles)
        gate, up = self.gate_up_proj(x, tiles).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up, tiles)


class LayeredRotaryTable(RotaryTable):
    """Gemma 3: the model's table (full-attention layers) and, as .sliding, the sliding layers' (local base, no
    scaling); a RotaryTable itself, so everything that takes the model's table still does."""

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, max_positions)
        self.sliding = RotaryTable(cfg.head_dim, cfg.local_rope_theta or cfg.rope_theta, None, max_positions)

    def to(self, device: torch.device, dtype: torch.dtype) -> LayeredRotaryTable:
        super().to(device, dtype)
        self.sliding.to(device, dtype)
        return self


class GemmaLayer(nn.Module):
    """Norms before and after both attention and MLP (Hugging Face names)."""

    def __init__(self, cfg: ModelConfig, index: int, max_positions: int) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = FamilyAttention(cfg, layer_variant(cfg, index, max_positions))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = GegluMLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.is_sliding = bool(cfg.layer_windows) and cfg.layer_windows[index] is not None

    def forward(self, x: torch.Tensor, pending: torch.Tensor | None, rope: RotaryTable, meta: StepMetadata,
                cache: PagedKVLayer) -> torch.Tensor:
        """As Llama's DecoderLayer: x is the residual stream (updated in place), pending the previous layer's
        output not yet added; returns this layer's (post-norm) MLP output."""
        if self.is_sliding and isinstance(rope, LayeredRotaryTable):
            rope = rope.sliding
        attended = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x, pending), rope, meta, cache))
        mlp_out = self.mlp(self.pre_feedforward_layernorm(x, attended), meta.tiles)
        return self.post_feedforward_layernorm(mlp_out)


class Gemma2Model(LlamaModel):
    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        return GemmaLayer(cfg, index, self.max_positions)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed(input_ids)
        # The scale rounded to the model dtype first, as transformers does (sqrt(3072) is 55.5 in bf16).
        return x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)

    def logits(self, hidden: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        logits = super().logits(hidden, tiles)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


class Gemma3Model(Gemma2Model):
    """Gemma 2's model with q/k norms (cfg.qk_norm, in FamilyAttention) and a rotary table per layer type."""

    def make_rope(self) -> RotaryTable:
        return LayeredRotaryTable(self.config, self.max_positions)
