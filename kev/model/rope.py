"""Rotary position embedding tables (default, linear and llama3 scaling), as Hugging Face computes them."""
from __future__ import annotations

import math
from typing import Any

import torch

from kev.errors import UnsupportedModelError


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise UnsupportedModelError(f"config.json: rope_scaling type {kind!r} is not supported (default, linear, llama3)")


def _llama3(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryTable:
    """cos/sin for every position up to max_positions, looked up per token.

    rotary_dim < head_dim (partial rotary, Phi-3 family): only the first rotary_dim dims of a head turn."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int,
                 rotary_dim: int | None = None) -> None:
        self.rotary_dim = rotary_dim if rotary_dim is not None and rotary_dim < head_dim else None
        inv_freq = inverse_frequencies(self.rotary_dim or head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_positions, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, head_dim]
        self.cos, self.sin = emb.cos(), emb.sin()

    def to(self, device: torch.device, dtype: torch.dtype) -> RotaryTable:
        self.cos, self.sin = self.cos.to(device, dtype), self.sin.to(device, dtype)
        return self

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, num_heads, head_dim]; positions: [num_tokens]
        if self.rotary_dim is not None:
            turned, kept = x.split([self.rotary_dim, x.shape[-1] - self.rotary_dim], dim=-1)
            return torch.cat([self._rotate(turned, positions), kept], dim=-1)
        return self._rotate(x, positions)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin
