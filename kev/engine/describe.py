"""What an engine runs on, in one dict: the start-up banner of `kev serve` and `kev worker` prints it."""
from __future__ import annotations

from typing import Any

from kev.config import KevConfig
from kev.engine.kv.memory_plan import KV_BYTES
from kev.model.model_config import ModelConfig


def describe(config: KevConfig, model: ModelConfig, num_blocks: int, device: str, threads: int) -> dict[str, Any]:
    core, router = config.core, config.router
    kv_tokens = num_blocks * core.block_size
    precision = core.resolved_precision
    kv_bytes = kv_tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * \
        KV_BYTES[core.activation_precision]
    return {"model": core.model_path, "architecture": model.model_type, "layers": model.num_layers,
            "params": model.num_params, "precision": precision,
            "precision_choice": core.precision_choice,
            "device": device, "threads": threads,
            "max_parallel": router.max_parallel_queries, "channel_pool": router.channel_pool_size,
            "max_context": core.max_context, "isolation": config.isolation.level, "kv_cache": config.isolation.kv_cache,
            "kv_blocks": num_blocks, "block_size": core.block_size, "kv_tokens": kv_tokens, "kv_bytes": kv_bytes,
            "speculative": _speculative(config)}


def _speculative(config: KevConfig) -> str:
    spec = config.speculative
    if spec.method == "off":
        return "off"
    return (f"{spec.method} (max_draft {spec.max_draft}, match {spec.min_match}-{spec.max_match} tokens, "
            f"drafts while a step holds < {spec.max_step_rows} rows"
            + (", and while measured step times say they pay)" if spec.policy == "measured" else ")"))


def banner(info: dict[str, Any]) -> str:
    """One line an operator reads at start-up (what vLLM and llama.cpp print before serving)."""
    if "kv_tokens" not in info:  # a router: the engines are the workers'
        return " ".join(f"{k}={v}" for k, v in info.items())
    return (f"model {info['model']} ({info['architecture']}, {info['layers']} layers, "
            f"{info['params'] / 1e6:.0f}M params), "
            f"{info.get('precision_choice') or info['precision']} on {info['device']}, {info['threads']} threads; "
            f"max_parallel {info['max_parallel']}, channel pool {info['channel_pool']}, "
            f"max_context {info['max_context']}; "
            f"isolation {info['isolation']} ({info['kv_cache']} KV); KV pool {info['kv_tokens']} tokens "
            f"({info['kv_blocks']} blocks x {info['block_size']}), {info['kv_bytes'] / 2**20:.1f} MiB"
            + (f"; {info['replicas']} replicas" if info.get("replicas", 1) > 1 else "")
            + (f"; speculative {info['speculative']}" if info.get("speculative", "off") != "off" else "")
            + (f"; numerics {info['numerics']}" if info.get("numerics") else ""))
