"""kev plan: the memory bill (weights + KV per channel, by level and mode) and whether it fits a device.

Shapes come from the config's model (its config.json only; no weights are loaded) or from
flags, e.g. the article's 7B example:
    kev plan --layers 32 --hidden 4096 --kv-heads 32 --head-dim 128 --max-context 4096 \
             --precision fp16 --channels 8 --device-memory 24GiB
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

from rich.console import Console
from rich.table import Table

from kev.config import KevConfig, load_config
from kev.errors import ConfigError
from kev.engine.kv.memory_plan import (HEADROOM_RULE, WEIGHT_BYTES, MemoryPlan, ModelShape, format_bytes,
                                       inputs_for, make_plan, parse_bytes)
from kev.model.model_config import ModelConfig

SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "intermediate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="kev.yaml (every field has a default)")
    parser.add_argument("--model", help="core.model_path: its config.json gives the shapes")
    parser.add_argument("--precision", choices=sorted(WEIGHT_BYTES), help="core.precision (int8: weight-only)")
    parser.add_argument("--device-memory", help="e.g. 24GiB, 80GB; default: this machine's GPU, else its RAM")
    parser.add_argument("--typical-tokens", type=int, default=512, help="a channel's own tokens at a typical length")
    parser.add_argument("--prefix-tokens", type=int, help="shared prefix length (default: the config's system prompt)")
    parser.add_argument("--max-context", type=int, help="core.max_context")
    parser.add_argument("--channels", type=int, help="router.max_parallel_queries")
    parser.add_argument("--pool-size", type=int, help="router.channel_pool_size (default with --channels: the same)")
    parser.add_argument("--block-size", type=int, help="core.block_size")
    shapes = parser.add_argument_group("model shapes (instead of, or over, the config's model)")
    for flag in SHAPE_FLAGS:
        shapes.add_argument("--" + flag.replace("_", "-"), type=int)
    shapes.add_argument("--params", type=float, help="parameter count for the weights, e.g. 7e9")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    shape, tokenizer_folder = resolve_shape(args, config)
    prefix = args.prefix_tokens
    if prefix is None:
        prefix = (prefix_token_count(tokenizer_folder, config.isolation.system_prompt, config.core.chat_template)
                  if tokenizer_folder else 0)
    memory, memory_source = _device_memory(args, config)
    plan = make_plan(inputs_for(config, shape, args.typical_tokens, prefix, memory))
    if args.json:
        print(json.dumps({**plan.to_dict(), "device_memory_source": memory_source}))
    else:
        print_plan(plan, memory_source)
    return 0


def _config(args: argparse.Namespace) -> KevConfig:
    """The config with flags applied. Validation runs, but fp16-on-CPU is not a planning error."""
    core = {"model_path": args.model, "max_context": args.max_context, "block_size": args.block_size}
    router = {"max_parallel_queries": args.channels, "channel_pool_size": args.pool_size}
    if args.channels and not args.pool_size:
        router["channel_pool_size"] = args.channels  # --channels alone: a pool of exactly that many
    overrides = {"core": {k: v for k, v in core.items() if v is not None},
                 "router": {k: v for k, v in router.items() if v is not None}}
    config = load_config(args.config, overrides)
    if args.precision:  # int8 is plannable before the engine runs it
        config = config.model_copy(update={"core": config.core.model_copy(update={"precision": args.precision})})
    return config


def resolve_shape(args: argparse.Namespace, config: KevConfig) -> tuple[ModelShape, Any]:
    """Shapes from flags over the config's model; the model folder too when one was read (for the tokenizer)."""
    base: dict[str, Any] = {}
    folder = None
    source = "flags"
    if not (args.layers and args.hidden):
        from kev.model.model_store import resolve_model_path

        folder = resolve_model_path(config.core.model_path)
        cfg = ModelConfig.from_folder(folder)
        base = {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "heads": cfg.num_heads,
                "kv_heads": cfg.num_kv_heads,
                "head_dim": cfg.head_dim, "vocab": cfg.vocab_size, "intermediate": cfg.intermediate_size,
                "tied": cfg.tie_word_embeddings}
        source = f"{config.core.model_path} ({folder / 'config.json'})"
    given = {flag: getattr(args, flag) for flag in SHAPE_FLAGS if getattr(args, flag) is not None}
    if given and base:
        source += " with " + ", ".join(f"--{k.replace('_', '-')}" for k in given)
    f = {**base, **given}
    if "heads" not in f:
        if "head_dim" not in f:
            raise ConfigError("kev plan: give --head-dim or --heads with --layers and --hidden")
        f["heads"] = f["hidden"] // f["head_dim"]
    f.setdefault("head_dim", f["hidden"] // f["heads"])
    f.setdefault("kv_heads", f["heads"])
    params = int(args.params) if args.params else None
    linear_params = linear_outputs = None
    if params is None and f.get("vocab") and f.get("intermediate"):
        cfg = ModelConfig(f["vocab"], f["hidden"], f["intermediate"], f["layers"], f["heads"], f["kv_heads"],
                          f["head_dim"], tie_word_embeddings=f.get("tied", False))
        params, linear_params, linear_outputs = cfg.num_params, cfg.linear_params, cfg.linear_outputs
    shape = ModelShape(f["layers"], f["hidden"], f["heads"], f["kv_heads"], f["head_dim"], params,
                       f.get("vocab"), f.get("intermediate"), source, linear_params, linear_outputs)
    return shape, folder


def prefix_token_count(folder: Any, system: str | None, chat_template: str | None = None) -> int:
    """Tokens the system prompt adds in front of every question: the common start of two rendered chats."""
    if not system:
        return 0
    from kev.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(folder, chat_template)
    ids = [tokenizer.encode(tokenizer.render_chat([{"role": "system", "content": system},
                                                   {"role": "user", "content": text}], add_generation_prompt=True))
           for text in ("a", "Zebra?")]
    return next((i for i, (a, b) in enumerate(zip(*ids)) if a != b), min(map(len, ids)))


def _device_memory(args: argparse.Namespace, config: KevConfig) -> tuple[int, str]:
    if args.device_memory:
        try:
            return parse_bytes(args.device_memory), "--device-memory"
        except ValueError as err:
            raise ConfigError(f"--device-memory: {err}") from None
    if config.core.device != "cpu":
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.total_memory, f"cuda:0 {props.name}"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host RAM (device cpu)"


def print_plan(plan: MemoryPlan, memory_source: str) -> None:
    p, s = plan.inputs, plan.inputs.shape
    console = Console(width=150)
    console.print(f"[bold]model[/] {s.source}: {s.num_layers} layers, hidden {s.hidden_size}, {s.num_heads} heads, "
                  f"{s.num_kv_heads} kv heads x {s.head_dim}; {p.precision}")
    console.print(f"weights        {format_bytes(plan.weights_bytes)}"
                  + ("" if plan.weights_bytes else "  (unknown: give --params, or --vocab and --intermediate)"))
    console.print(f"KV per token   {plan.kv_bytes_per_token:,} B = 2 x {s.num_layers} layers x "
                  f"{s.num_kv_heads} kv heads "
                  f"x {s.head_dim} x {plan.kv_bytes_per_token // (2 * s.num_layers * s.num_kv_heads * s.head_dim)} B")
    console.print(f"KV, {p.channels} channels x {p.max_context} tokens: {plan.kv_bytes:,} B "
                  f"({format_bytes(plan.kv_bytes)}); "
                  f"article's 2 x layers x hidden x tokens x bytes: {plan.kv_bytes_article:,} B "
                  f"({format_bytes(plan.kv_bytes_article)})")
    table = Table(title=f"KV by level (block {p.block_size}, prefix {p.prefix_tokens} tokens, typical = prefix + "
                        f"{p.typical_tokens} tokens)")
    for column in ("level", "kv_cache", "channels", "prefix once", "per ch @max", "per ch @typical",
                   "total @max", "total @typical", "fit @max", "fit @typical"):
        table.add_column(column, justify="right")
    for c in plan.levels:
        table.add_row(c.level, c.kv_cache, str(c.channels), format_bytes(c.shared_bytes),
                      format_bytes(c.per_channel_max_bytes), format_bytes(c.per_channel_typical_bytes),
                      format_bytes(c.total_max_bytes), format_bytes(c.total_typical_bytes),
                      _count(c.channels_that_fit), _count(c.channels_that_fit_typical))
    console.print(table)
    console.print(f"engine allocates at start-up ({p.kv_cache}): {format_bytes(plan.pool_bytes)} of KV")
    console.print(f"device {format_bytes(p.device_memory)} ({memory_source}); {HEADROOM_RULE}: "
                  f"{format_bytes(plan.headroom_bytes)}")
    verdict = {True: "[green]fits[/]", False: "[red]does not fit[/]", None: "unknown (weights unknown)"}[plan.fits]
    total = (plan.weights_bytes or 0) + plan.pool_bytes + (plan.headroom_bytes or 0)
    console.print(f"weights + KV pool + headroom = {format_bytes(total)}"
                  f": {verdict}; strict channels at max_context that fit: "
                  f"{_count(plan.channels_that_fit)}")


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)
