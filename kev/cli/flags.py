"""Command-line flags as config fields: each flag given becomes a FlagValue (flag, config key, value), so one place
merges them over the YAML, refuses a flag that contradicts the YAML (naming both), and shows them in the banner.

vLLM's common `vllm serve` flags (and llama.cpp's short ones) map onto Kev's fields here, so a vLLM command line
works as it is: --dtype, --max-model-len (-c), --max-num-seqs (-np), --served-model-name, --tool-call-parser,
--tensor-parallel-size (-tp), --gpu-memory-utilization; --trust-remote-code is accepted with a notice (Kev runs no
code from a model folder). --max-model-len above the model's own maximum is refused, as vLLM refuses it.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kev.config import load_config
from kev.config.load import ConfigSource, explicit_values
from kev.config.schema import KevConfig
from kev.errors import ConfigError, KevError

# vLLM's --dtype names (and Kev's own) -> core.precision
DTYPES = {"auto": "auto", "float32": "fp32", "float": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
          "float16": "fp16", "half": "fp16", "fp16": "fp16"}
POOL_PER_CHANNEL = 2  # --max-num-seqs N without a pool in the YAML: a pool of 2N (the spec's 1.5-2x guidance)


@dataclass(frozen=True)
class FlagValue:
    flag: str  # as typed: "--max-model-len"
    key: str  # "core.max_context"
    value: Any
    secret: bool = False  # shown as *** (an API key)
    typed: str | None = None  # the value as typed, when the flag spells it differently (--dtype bfloat16)

    def shown(self) -> str:
        return "***" if self.secret else self.typed or str(self.value)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's engine flags that `kev serve` and `kev run` both take."""
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="core.precision, in vLLM's names (bfloat16: bf16)")
    parser.add_argument("--max-model-len", "-c", "--ctx-size", dest="max_model_len", type=int,
                        help="core.max_context: prompt + answer tokens per question (vLLM; llama.cpp's -c)")
    parser.add_argument("--max-num-seqs", "-np", "--parallel", dest="max_num_seqs", type=int,
                        help="router.max_parallel_queries: channels in one forward (vLLM; llama.cpp's -np); the "
                             f"channel pool becomes {POOL_PER_CHANNEL}x that unless the YAML sets it")
    parser.add_argument("--gpu-memory-utilization", dest="gpu_memory_utilization", type=float,
                        help="core.gpu_memory_utilization: on a GPU, the share of its memory weights + KV cache may "
                             "take (the KV cache gets what is left, at most what the channels need); no effect on "
                             "a CPU (vLLM's flag)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="accepted for vLLM command lines: Kev runs no code from a model folder")


def engine_flag_values(args: argparse.Namespace) -> list[FlagValue]:
    values = []
    if getattr(args, "dtype", None) is not None:
        values.append(FlagValue("--dtype", "core.precision", DTYPES[args.dtype], typed=args.dtype))
    if getattr(args, "max_model_len", None) is not None:
        values.append(FlagValue("--max-model-len", "core.max_context", args.max_model_len))
    if getattr(args, "max_num_seqs", None) is not None:
        values.append(FlagValue("--max-num-seqs", "router.max_parallel_queries", args.max_num_seqs))
    if getattr(args, "gpu_memory_utilization", None) is not None:
        values.append(FlagValue("--gpu-memory-utilization", "core.gpu_memory_utilization",
                                args.gpu_memory_utilization))
    return values


def flag_notices(args: argparse.Namespace, config: KevConfig) -> list[str]:
    """One line each for vLLM flags that mean something else (or nothing) here, said at start-up."""
    notices = []
    if getattr(args, "trust_remote_code", False):
        notices.append("--trust-remote-code: accepted; Kev runs no code from a model folder (it has its own "
                       "implementation of each architecture it serves), so there is nothing to trust")
    fraction = config.core.gpu_memory_utilization
    if fraction is not None and not _on_gpu(config):
        notices.append(f"--gpu-memory-utilization {fraction:g}: no GPU here (core.device {config.core.device}); on a "
                       "CPU the KV cache is sized by channels x core.max_context (or core.kv_cache_tokens), so the "
                       "flag changes nothing")
    return notices


def _on_gpu(config: KevConfig) -> bool:
    if config.core.device != "auto":
        return config.core.device.startswith("cuda")
    import torch

    return bool(torch.cuda.is_available())


def check_model_len(config: KevConfig, flags: list[FlagValue]) -> None:
    """--max-model-len above the model's maximum (its max_position_embeddings) is an error naming both."""
    flag = next((f for f in flags if f.flag == "--max-model-len"), None)
    if flag is None:
        return
    from kev.model.model_config import ModelConfig
    from kev.model.model_store import resolve_model_path

    try:
        model = ModelConfig.from_folder(resolve_model_path(config.core.model_path))
    except (KevError, OSError, ValueError):  # the model cannot be read here: loading it says why
        return
    if flag.value > model.max_position_embeddings:
        raise ConfigError(f"--max-model-len {flag.value} is above the model's maximum, {model.max_position_embeddings} "
                          f"tokens (max_position_embeddings of {config.core.model_path}); give at most "
                          f"{model.max_position_embeddings}")


def config_with_flags(source: ConfigSource, flags: list[FlagValue],
                      extra: dict[str, Any] | None = None) -> tuple[KevConfig, list[FlagValue]]:
    """The YAML with the flags over it, and the flags as applied (with the keys they moved along).

    A flag that sets a key the YAML (or another flag) sets to something else is an error naming both."""
    in_file = explicit_values(source)
    seen: dict[str, FlagValue] = {}
    for flag in flags:
        if flag.key in in_file and in_file[flag.key] != flag.value:
            shown = "***" if flag.secret else str(in_file[flag.key])
            raise ConfigError(f"{flag.flag} {flag.shown()} contradicts {flag.key}: {shown} in {source}; "
                              "drop one of them")
        other = seen.setdefault(flag.key, flag)
        if other.value != flag.value:
            raise ConfigError(f"{flag.flag} {flag.shown()} contradicts {other.flag} {other.shown()} (both set "
                              f"{flag.key})")
    applied = flags + _derived(flags, in_file)
    overrides: dict[str, Any] = {}
    for flag in applied:
        section, field = flag.key.split(".", 1)
        overrides.setdefault(section, {})[field] = flag.value
    for section, values in (extra or {}).items():
        overrides.setdefault(section, {}).update(values)
    config = load_config(source, overrides)
    check_model_len(config, applied)
    return config, applied


def _derived(flags: list[FlagValue], in_file: dict[str, Any]) -> list[FlagValue]:
    """Keys a flag moves along with its own: a pool big enough for --max-num-seqs, unless the YAML sets one."""
    seqs = next((f.value for f in flags if f.flag == "--max-num-seqs"), None)
    if seqs is None or "router.channel_pool_size" in in_file:
        return []
    default_pool = KevConfig().router.channel_pool_size
    return [FlagValue("--max-num-seqs", "router.channel_pool_size", max(default_pool, POOL_PER_CHANNEL * seqs))]


def describe_flags(flags: list[FlagValue]) -> str:
    """For the start-up banner: which flag set which config field."""
    return ", ".join(f"{f.flag}{' ' + f.typed if f.typed else ''} -> {f.key}={'***' if f.secret else f.value}"
                     for f in flags)


def model_path(value: str) -> str:
    """A positional MODEL as core.model_path (a folder, a .gguf file or an alias), as `vllm serve MODEL`."""
    return str(Path(value).expanduser()) if Path(value).expanduser().exists() else value
