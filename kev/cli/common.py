"""Flags shared by several commands, mapped onto config fields."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from kev.cli.flags import FlagValue, config_with_flags, engine_flag_values, flag_notices
from kev.config import KevConfig

# (flag, config key, argparse dest) of the flags every engine command takes
_CONFIG_FLAGS = (("--model", "core.model_path", "model"), ("--precision", "core.precision", "precision"),
                 ("--threads", "core.threads", "threads"), ("--tensor-parallel", "core.tensor_parallel",
                                                            "tensor_parallel"),
                 ("--chat-template", "core.chat_template", "chat_template"))


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="kev.yaml (every field has a default)")
    parser.add_argument("--model", help="core.model_path: HF folder, .gguf file or alias")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16", "int8", "w8a8", "gguf"],
                        help="core.precision")
    parser.add_argument("--threads", type=int, help="core.threads (torch CPU threads)")
    parser.add_argument("--tensor-parallel", "--tensor-parallel-size", "-tp", dest="tensor_parallel", type=int,
                        help="core.tensor_parallel (ranks the model is split over; vLLM's --tensor-parallel-size)")
    parser.add_argument("--chat-template", help="core.chat_template: a Jinja file, or the template itself")


def config_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None,
                     flags: list[FlagValue] | None = None) -> KevConfig:
    return config_and_flags(args, extra, flags)[0]


def config_and_flags(args: argparse.Namespace, extra: dict[str, Any] | None = None,
                     flags: list[FlagValue] | None = None) -> tuple[KevConfig, list[FlagValue]]:
    """The config of --config with every flag given over it (flags contradicting the YAML are errors), and the
    flags as applied (for the banner)."""
    given = [FlagValue(flag, key, getattr(args, dest)) for flag, key, dest in _CONFIG_FLAGS
             if getattr(args, dest) is not None]
    config, applied = config_with_flags(args.config, given + engine_flag_values(args) + (flags or []), extra)
    for notice in flag_notices(args, config):
        print(f"kev: {notice}", file=sys.stderr)
    return config, applied


class Report(Protocol):
    @property
    def ok(self) -> bool: ...

    def to_dict(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Report)


def report_and_exit_code(report: R, as_json: bool, print_report: Callable[[R], None]) -> int:
    """A check's report, as JSON or as tables; its exit status (0: every check passed)."""
    if as_json:
        print(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        print_report(report)
    return 0 if report.ok else 1
