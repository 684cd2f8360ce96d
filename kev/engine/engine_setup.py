"""Build an engine's parts from a config: model, tokenizer, KV blocks, channel pool, scheduler.

Derived sizes are computed here, once, and logged.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from kev.config import KevConfig
from kev.engine.channel_pool import ChannelPool
from kev.engine.embedder import MeanEmbedder
from kev.engine.model_runner import ModelRunner
from kev.engine.prefix_jobs import PrefixJobs
from kev.engine.fair_share import FairShare
from kev.engine.scheduler import Scheduler, SchedulerLimits
from kev.engine.row_tiling import row_tiling
from kev.errors import ConfigError
from kev.engine.kv.block_manager import BlockManager
from kev.engine.kv.memory_plan import KV_BYTES, blocks, gpu_budget_blocks, kv_pool_blocks
from kev.engine.kv.prefix_store import PrefixStore
from kev.model.device import pick_device
from kev.model.llama import LlamaModel
from kev.model.model_store import gguf_source, resolve_model_path
from kev.model.tokenizer import Tokenizer
from kev.model.weights import load_model
from kev.router.router import Router

log = logging.getLogger("kev.engine")


@dataclass
class EngineParts:
    tokenizer: Tokenizer
    runner: ModelRunner
    blocks: BlockManager
    pool: ChannelPool
    scheduler: Scheduler
    router: Router


def load_model_and_tokenizer(config: KevConfig) -> tuple[LlamaModel, Tokenizer]:
    core = config.core
    if core.threads:
        torch.set_num_threads(core.threads)
    folder = resolve_model_path(core.model_path)
    device = pick_device(core.device)
    precision = core.resolved_precision
    if precision == "fp16" and device.type == "cpu":
        raise ConfigError("core.precision: fp16 needs a CUDA device (core.device is cpu); use fp32, bf16 or auto")
    log.info("precision: %s", core.precision_choice)
    gguf = gguf_source(core.model_path) if precision == "gguf" else None
    if precision == "gguf" and gguf is None:
        raise ConfigError(f"core.precision: gguf needs a .gguf model (core.model_path {core.model_path!r} is a "
                          "Hugging Face folder); use w8a8, int8 or bf16")
    model = load_model(folder, precision, device, core.max_context, gguf=gguf)
    tokenizer = Tokenizer.from_folder(folder, core.chat_template)
    named_instruct = any(word in f"{core.model_path} {folder.name}".lower() for word in ("instruct", "chat"))
    if named_instruct and not tokenizer.has_chat_template:
        log.warning("model %s looks like an instruct model but has no chat template (chat_template.jinja, "
                    "tokenizer_config.json, chat_template.json): questions go in as raw text; give one with "
                    "core.chat_template or --chat-template", core.model_path)
    return model, tokenizer


def build_parts(config: KevConfig, model: LlamaModel | None = None, tokenizer: Tokenizer | None = None,
                tp_devices: list[str] | None = None) -> EngineParts:
    """tp_devices: under core.tensor_parallel, the ranks' devices (multi_gpu: one replica's share of deploy.devices)."""
    if model is None or tokenizer is None:
        model, tokenizer = load_model_and_tokenizer(config)
    core, router = config.core, config.router
    unified = config.isolation.kv_cache == "unified"
    num_blocks = kv_pool_blocks(config.isolation.kv_cache, core.max_context, core.block_size,
                                router.max_parallel_queries, router.channel_pool_size, core.kv_cache_tokens)
    if core.gpu_memory_utilization is not None and model.device.type == "cuda" and not unified:
        num_blocks = _gpu_budget(config, model, num_blocks)
    blocks = BlockManager(num_blocks, core.block_size)
    if unified:
        for channel in range(router.channel_pool_size):
            blocks.reserve(channel, core.max_context)
    device_label = ""  # Kev's Triton kernels where they run (DeviceSetup.label)
    if core.tensor_parallel > 1:
        from kev.engine.tp_runner import start_tensor_parallel

        runner: ModelRunner = start_tensor_parallel(config, model, num_blocks, tp_devices)
    else:
        tiling, setup = row_tiling(config, model)
        device_label = setup.label
        runner = ModelRunner(model, num_blocks, core.block_size, tiling, device_label)
        if setup.graphable and core.cuda_graphs and model.device.type == "cuda":
            runner.use_decode_graphs(router.max_parallel_queries, core.max_context)
    kernels = "kev kernels" if model.cpu_kernels else (device_label or "torch ops")
    log.info("linear rows: %s; row ops and decode attention: %s; %s, %d threads (OMP_WAIT_POLICY=%s, "
             "GOMP_SPINCOUNT=%s)", runner.tiling.label, kernels,
             runner.dtype, torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY", "unset"),
             os.environ.get("GOMP_SPINCOUNT", "unset"))
    log.info("KV cache: %d blocks x %d tokens (%s), %.1f MiB", num_blocks, core.block_size,
             config.isolation.kv_cache, num_blocks * core.block_size * runner.kv_bytes_per_token / 2**20)
    limits = SchedulerLimits(router.max_parallel_queries, core.max_step_tokens, core.prefill_chunk, core.max_context,
                             unified, router.max_queue, config.speculative)
    pool = ChannelPool(router.channel_pool_size, router.channel_queue_depth)
    prefixes = PrefixJobs(blocks, PrefixStore(blocks))
    gateway = Router(router, MeanEmbedder(model.embed_tokens.full_weight(), tokenizer))
    log.info("router: %s, channel groups %s", router.strategy,
             [(g.name, len(g.channels), g.slots) for g in gateway.layout.groups])
    eos_ids = set(tokenizer.eos_token_ids) | set(model.config.eos_token_ids)
    scheduler = Scheduler(limits, blocks, pool, prefixes, gateway, eos_ids,
                          FairShare(config.sharing, limits.max_parallel, limits.max_queue))
    return EngineParts(tokenizer, runner, blocks, pool, scheduler, gateway)


def _gpu_budget(config: KevConfig, model: LlamaModel, num_blocks: int) -> int:
    """core.gpu_memory_utilization: the pool shrinks to what fits in that share of the GPU (never grows past what
    the channels need); too small for one channel's context is a config error naming both."""
    core, shape = config.core, model.config
    per_block = core.block_size * 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * \
        KV_BYTES[core.activation_precision]
    total = torch.cuda.get_device_properties(model.device).total_memory
    fits = gpu_budget_blocks(core.gpu_memory_utilization or 1.0, total, torch.cuda.memory_allocated(model.device),
                             per_block)
    if fits < blocks(core.max_context, core.block_size):
        raise ConfigError(f"core.gpu_memory_utilization {core.gpu_memory_utilization}: {fits} KV blocks fit, fewer "
                          f"than one channel's context needs ({blocks(core.max_context, core.block_size)} blocks for "
                          f"core.max_context {core.max_context}); raise it or lower core.max_context")
    log.info("KV cache: core.gpu_memory_utilization %g of %.1f GiB: %d blocks fit, %d used",
             core.gpu_memory_utilization, total / 2**30, fits, min(fits, num_blocks))
    return min(fits, num_blocks)
