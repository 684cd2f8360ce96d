"""How a model's linear layers take their rows: its weights prepacked, Kev's CPU kernels where they apply, then
fixed row tiles or (where the start-up probe proves a row's bits never depend on its neighbours) one GEMM a step.
One function for a whole model and for a tensor-parallel shard."""
from __future__ import annotations

from dataclasses import replace

from kev.config import KevConfig
from kev.engine.packer import TilePlan
from kev.model.kernels import load_cpu_kernels
from kev.model.llama import LlamaModel
from kev.model.model_store import cache_root
from kev.model.row_invariance import probe as probe_rows


def tile_plan(config: KevConfig, model: LlamaModel, probe: bool = True) -> TilePlan:
    """Prepack the weights and load the CPU kernels, then let the row invariance probe decide between one GEMM per
    step and fixed tiles (core.row_plan: tiles skips the probe). probe=False (a tensor-parallel shard, whose sums
    run between layers): fixed tiles, and the Python layer loop instead of the one-call decoder op."""
    core = config.core
    device = next(model.parameters()).device
    kernels = core.kernels == "auto" and device.type == "cpu" and load_cpu_kernels(cache_root())
    model.use_cpu_kernels(kernels)  # off also where an earlier engine in this process turned them on
    model.prepack(config.router.max_parallel_queries, kev_gemm=kernels)
    fixed = TilePlan(core.linear_tile, core.prefill_tile, core.batch_invariant)
    if not probe:
        model.fused_layers = None
        return fixed
    if core.row_plan == "tiles" or not core.batch_invariant:
        return fixed
    max_samples = max(config.router.max_parallel_queries, 2)
    verdict = probe_rows(model.row_multiplies(core.max_step_tokens, max_samples), model.dtype, model.device,
                         cache_root() / "probes", model.kernel_identity())
    if not verdict.free_rows:
        return fixed
    return replace(fixed, free_rows=True, min_rows=verdict.min_rows, max_sample_rows=max_samples)
