"""Flags shared by several commands, mapped onto config fields."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from kev.config import KevConfig, load_config


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="kev.yaml (every field has a default)")
    parser.add_argument("--model", help="core.model_path: HF folder, .gguf file or alias")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16", "int8", "w8a8", "gguf"],
                        help="core.precision")
    parser.add_argument("--threads", type=int, help="core.threads (torch CPU threads)")
    parser.add_argument("--tensor-parallel", type=int, help="core.tensor_parallel (ranks the model is split over)")
    parser.add_argument("--chat-template", help="core.chat_template: a Jinja file, or the template itself")


def config_from_args(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> KevConfig:
    core = {key: value for key, value in (("model_path", args.model), ("precision", args.precision),
                                           ("threads", args.threads), ("tensor_parallel", args.tensor_parallel),
                                           ("chat_template", args.chat_template)) if value is not None}
    overrides: dict[str, Any] = {"core": core} if core else {}
    for section, values in (extra or {}).items():
        overrides.setdefault(section, {}).update(values)
    return load_config(args.config, overrides)


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
