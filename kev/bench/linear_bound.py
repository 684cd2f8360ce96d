"""The bound a decode step cannot beat: the model's own linear layers (every layer's qkv, o, gate_up,
down, then the lm_head) at M rows, with the kernel and weights the engine uses, nothing else."""
from __future__ import annotations

import statistics
import time
from typing import cast

import torch

from kev.model.llama import DecoderLayer, LlamaModel


@torch.inference_mode()
def linear_stack_ms(model: LlamaModel, rows: int, repeats: int = 5, with_lm_head: bool = True) -> float:
    """Median milliseconds of one pass over every linear layer at `rows` rows (with_lm_head=False: a prefill step's
    layers, whose lm_head runs on the sampled rows only)."""
    cfg, dtype = model.config, model.dtype
    x = torch.randn(rows, cfg.hidden_size, dtype=dtype)
    wide = torch.randn(rows, cfg.intermediate_size, dtype=dtype)
    tiles = [rows]

    def one_pass() -> None:
        for module in model.layers:
            layer = cast(DecoderLayer, module)
            layer.self_attn.qkv_proj(x, tiles)
            layer.self_attn.o_proj(x, tiles)
            layer.mlp.gate_up_proj(x, tiles)
            layer.mlp.down_proj(wide, tiles)
        if with_lm_head:
            model.logits(x, tiles)

    one_pass()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        one_pass()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)
