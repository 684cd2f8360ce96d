"""Command-line flags as config fields: each flag given becomes a FlagValue (flag, config key, value), so one place
merges them over the YAML, refuses a flag that contradicts the YAML (naming both), and shows them in the banner.

vLLM's common `vllm serve` flags (and llama.cpp's short ones) map onto Kev's fields here, so a vLLM command line
works as it is: --dtype, --max-model-len (-c), --max-num-seqs (-np), --served-model-name, --tool-call-parser.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kev.config import load_config
from kev.config.load import ConfigSource, explicit_values
from kev.config.schema import KevConfig
from kev.errors import ConfigError

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


def engine_flag_values(args: argparse.Namespace) -> list[FlagValue]:
    values = []
    if getattr(args, "dtype", None) is not None:
        values.append(FlagValue("--dtype", "core.precision", DTYPES[args.dtype], typed=args.dtype))
    if getattr(args, "max_model_len", None) is not None:
        values.append(FlagValue("--max-model-len", "core.max_context", args.max_model_len))
    if getattr(args, "max_num_seqs", None) is not None:
        values.append(FlagValue("--max-num-seqs", "router.max_parallel_queries", args.max_num_seqs))
    return values


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
    return load_config(source, overrides), applied


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
