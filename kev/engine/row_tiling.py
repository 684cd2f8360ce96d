"""How a model's linear layers take their rows: its weights prepacked, Kev's kernels where they apply (the CPU's C++
ones, Kev's Triton ones on CUDA), then fixed row tiles or (where the start-up probe proves a row's bits never depend on
its neighbours) one GEMM a step. The same preparation for a whole model and for a tensor-parallel shard."""
from __future__ import annotations

import logging
from dataclasses import replace

from kev.config import KevConfig
from kev.engine.device_setup import DeviceSetup, check_gpu_linear, device_kernels
from kev.engine.packer import RowTiling
from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.head_rescoring import two_pass_head
from kev.model.llama import LlamaModel
from kev.model.model_store import cache_root
from kev.model.quant_weight import kernel_paths
from kev.model.row_invariance import probe as probe_rows
from kev.model.row_invariance import probe_tiles

log = logging.getLogger(__name__)


def row_tiling(config: KevConfig, model: LlamaModel) -> tuple[RowTiling, DeviceSetup]:
    """Prepack the weights and load the decode kernel for the CPU (Kev's Triton kernels and the linear kernel on
    CUDA), then let the row invariance probe decide between one GEMM per step and fixed tiles (core.row_plan: tiles
    skips the probe)."""
    core = config.core
    kernels = _use_cpu_kernels(config, model)
    ops = device_kernels(config, model)
    graphable = model.use_device_kernels(ops)
    model.prepack(config.router.max_parallel_queries, kev_gemm=kernels)
    model.rescored_head = two_pass_head(model) if kernels else None
    setup = DeviceSetup(ops, graphable, check_gpu_linear(config, model, ops))
    fixed = RowTiling(core.linear_tile, core.prefill_tile, core.batch_invariant, paged=graphable)
    if ops is not None and core.batch_invariant:
        setup.tile_probe = "ok" if probe_tiles(model.row_multiplies(1, 1), [fixed.small, fixed.big], model.dtype,
                                                    model.device) else "FAILED"
    if core.row_plan == "tiles" or not core.batch_invariant:
        return fixed, setup
    max_samples = max(config.router.max_parallel_queries, 2)
    verdict = probe_rows(model.row_multiplies(core.max_step_tokens, max_samples), model.dtype, model.device,
                         cache_root() / "probes", model.kernel_identity())
    if not verdict.free_rows:
        return fixed, setup
    return replace(fixed, free_rows=True, min_rows=verdict.min_rows, max_sample_rows=max_samples), setup


def shard_row_tiling(config: KevConfig, shard: LlamaModel) -> RowTiling:
    """A tensor-parallel shard: prepacked and on the CPU kernels where they apply, rows in fixed tiles (a row's bits
    then never depend on its neighbours, whatever each rank's shapes are), no probe; its sums run between layers, so
    the Python layer loop, not the one-call decoder op."""
    kernels = _use_cpu_kernels(config, shard)
    shard.prepack(config.router.max_parallel_queries, kev_gemm=kernels)
    shard.fused_layers = None
    shard.rescored_head = None  # every rank runs the plain head (a shard's copy)
    core = config.core
    return RowTiling(core.linear_tile, core.prefill_tile, core.batch_invariant)


def _use_cpu_kernels(config: KevConfig, model: LlamaModel) -> bool:
    device = next(model.parameters()).device
    kernels = config.core.kernels == "auto" and device.type == "cpu" and load_cpu_kernels(cache_root())
    model.use_cpu_kernels(kernels)  # off also where an earlier engine in this process turned them on
    if device.type == "cpu" and config.core.resolved_precision in ("gguf", "w8a8") and not kernel_paths():
        log.warning("core.precision %s without Kev's CPU kernels (core.kernels %s, or they did not build): its "
                    "blocks run on torch's reference ops, which dequantize every weight every step; bf16 or fp32 "
                    "is faster here", config.core.resolved_precision, config.core.kernels)
    return kernels
