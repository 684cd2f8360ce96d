"""Build an engine's parts from a config: model, tokenizer, KV blocks, channel pool, scheduler.

Derived sizes are computed here, once, and logged.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from kev.config import KevConfig
from kev.config.precision import describe as describe_precision
from kev.engine.channel_pool import ChannelPool
from kev.engine.embedder import MeanEmbedder
from kev.engine.model_runner import ModelRunner
from kev.engine.prefix_jobs import PrefixJobs
from kev.engine.scheduler import Scheduler, SchedulerLimits
from kev.engine.tile_plan import tile_plan
from kev.errors import ConfigError
from kev.isolation.block_manager import BlockManager
from kev.isolation.memory_plan import kv_pool_blocks
from kev.isolation.prefix_store import PrefixStore
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
    log.info("precision: %s", describe_precision(core.precision, core.device))
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
    blocks = BlockManager(num_blocks, core.block_size)
    if unified:
        for channel in range(router.channel_pool_size):
            blocks.reserve(channel, core.max_context)
    device_label = ""  # Kev's Triton kernels where they run (DeviceSetup.label)
    if core.tensor_parallel > 1:
        from kev.engine.tp_runner import start_tensor_parallel

        runner: ModelRunner = start_tensor_parallel(config, model, num_blocks, tp_devices)
    else:
        plan, setup = tile_plan(config, model)
        device_label = setup.label
        runner = ModelRunner(model, num_blocks, core.block_size, plan, device_label)
        if setup.graphable and core.cuda_graphs and model.device.type == "cuda":
            runner.use_decode_graphs(router.max_parallel_queries, core.max_context)
    kernels = "kev kernels" if model.cpu_kernels else (device_label or "torch ops")
    log.info("linear rows: %s; row ops and decode attention: %s; %s, %d threads (OMP_WAIT_POLICY=%s, "
             "GOMP_SPINCOUNT=%s)", runner.plan.label, kernels,
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
    scheduler = Scheduler(limits, blocks, pool, prefixes, gateway, eos_ids)
    return EngineParts(tokenizer, runner, blocks, pool, scheduler, gateway)
