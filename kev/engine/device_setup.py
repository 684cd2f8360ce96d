"""The CUDA step's parts, chosen at start-up: Kev's Triton kernels, the linear kernel, the decode graphs.

Everything here is decided once from the config and the device and recorded in the numerics fingerprint
(ModelRunner.device_label), so two engines whose answers could differ never share a fingerprint.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kev.config import KevConfig
from kev.errors import ConfigError
from kev.model.triton import interpreting, triton_importable, triton_runs_on
from kev.model.triton.ops import DeviceOps, triton_ops
from kev.model.linear import Linear
from kev.model.llama import LlamaModel

log = logging.getLogger("kev.engine")


@dataclass
class DeviceSetup:
    ops: DeviceOps | None  # Kev's Triton kernels, or None (torch ops, or the CPU's C++ kernels)
    graphable: bool  # attention on the Triton kernels: every layer reads PagedRows only, decode can be CUDA graphs
    linear: str  # the linear kernel on the device: cublas (fixed row tiles), triton-persistent-gemm, torch
    tile_probe: str = "not-run"  # fixed row tiles checked at start-up: a row's bits whatever its tile neighbours

    @property
    def label(self) -> str:
        """What decides the bits here, for the numerics fingerprint ("" where Kev's Triton kernels are off)."""
        if self.ops is None:
            return ""
        attention = "paged-fixed-tiles" if self.graphable else "sdpa-per-channel,sdpa=efficient|math"
        return f"kernels=kev-{self.ops.name},attn={attention},linear={self.linear},tile-probe={self.tile_probe}"


def device_kernels(config: KevConfig, model: LlamaModel) -> DeviceOps | None:
    """Kev's Triton kernels for this model, or None (CPU with its C++ kernels, core.kernels torch, no triton).
    core.kernels triton insists: a clear load error where they cannot run."""
    core, device = config.core, model.device
    wanted = core.kernels == "triton" or (core.kernels == "auto" and device.type == "cuda")
    if not wanted:
        return None
    reason = _cannot_run(core.block_size, device)
    if reason is None:
        return triton_ops()
    if core.kernels == "triton":
        raise ConfigError(f"core.kernels: triton {reason}")
    log.warning("Kev's Triton kernels are off (%s): torch ops per channel instead", reason)
    return None


def _cannot_run(block_size: int, device: torch.device) -> str | None:
    if not triton_importable():
        return "needs the triton package (pip install triton)"
    if not triton_runs_on(device):
        return f"runs on CUDA (on {device.type} only under TRITON_INTERPRET=1)"
    if block_size & (block_size - 1):
        return f"needs core.block_size a power of two (one key tile is one block), got {block_size}"
    return None


def use_triton_gemm(model: LlamaModel) -> None:
    """Every linear layer but the token table's lookups on the persistent Triton GEMM (core.gpu_linear triton)."""
    from kev.model.triton.gemm_kernel import TritonGemmWeight

    for module in model.modules():
        if isinstance(module, Linear) and module.scale is None:  # int8 weights keep their own path
            # Linear calls whatever multiply `packed` holds on its rows; its annotation names the CPU packings only.
            module.packed = TritonGemmWeight(module.weight, module.bias)  # type: ignore[assignment]


def check_gpu_linear(config: KevConfig, model: LlamaModel, ops: DeviceOps | None) -> str:
    """The linear kernel's name for the fingerprint; core.gpu_linear triton needs the Triton kernels."""
    if config.core.gpu_linear != "triton":
        return "cublas" if model.device.type == "cuda" else "torch"
    if ops is None:
        raise ConfigError("core.gpu_linear: triton needs Kev's Triton kernels (core.kernels auto or triton, on CUDA)")
    if model.device.type != "cuda" and not interpreting():
        raise ConfigError("core.gpu_linear: triton runs on CUDA")
    use_triton_gemm(model)
    return "triton-persistent-gemm"
