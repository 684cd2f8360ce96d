"""Which implementation of the per-row device ops a model runs: Kev's Triton kernels, or their torch reference."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from kev.model.triton import reference


@dataclass(frozen=True)
class DeviceOps:
    """add_rms_norm, gated, argmax, rope_store_kv, paged_attention: the same signatures in both implementations."""

    name: str  # "triton-<version>" or "torch-reference"
    impl: ModuleType

    def add_rms_norm(self, x: torch.Tensor, pending: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        return self.impl.add_rms_norm(x, pending, weight, eps)

    def gated(self, gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
        return self.impl.gated(gate_up, gelu)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return self.impl.argmax(logits)

    def rope_store_kv(self, qkv: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      positions: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> None:
        self.impl.rope_store_kv(qkv, kv, cos, sin, positions, slots, heads, kv_heads, head_dim)

    def paged_attention(self, q: torch.Tensor, kv: torch.Tensor, tables: torch.Tensor, lengths: torch.Tensor,
                        block_size: int, scale: float) -> torch.Tensor:
        return self.impl.paged_attention(q, kv, tables, lengths, block_size, scale)


def triton_ops() -> DeviceOps:
    import triton

    from kev.model.triton import triton_ops as kernels

    return DeviceOps(f"triton-{triton.__version__}", kernels)


def reference_ops() -> DeviceOps:
    return DeviceOps("torch-reference", reference)

