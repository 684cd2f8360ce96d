"""kev stress: a varied-length soak in waves; alert counts from the audit log and answers vs solo runs."""
from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from kev.cli.common import add_config_flags, config_from_args, report_and_exit_code
from kev.cli.progress import progress_bar
from kev.config import KevConfig
from kev.engine.engine import Engine
from kev.engine.engine_setup import build_parts, load_model_and_tokenizer
from kev.errors import ConfigError
from kev.isolation.alert_log import ALERT_KINDS, EXPECTED_IN_SOAK
from kev.isolation.levels import LEVELS
from kev.isolation.stress import StressOptions, StressReport, run_stress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds, all levels together")
    parser.add_argument("--questions", type=int, default=48, help="distinct questions per level")
    parser.add_argument("--max-context", type=int, default=512,
                        help="core.max_context for the soak (small, so prompts near it are cheap)")
    parser.add_argument("--max-tokens", type=int, default=12, help="most new tokens per question")
    parser.add_argument("--levels",
                        help="comma-separated, e.g. strict,shared (default: every level the config can run)")
    parser.add_argument("--seed", type=int, help="seed of questions and waves")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args, {"core": {"max_context": args.max_context}})
    levels = tuple(args.levels.split(",")) if args.levels else None
    if levels and set(levels) - set(LEVELS):
        raise ConfigError(f"--levels: unknown level(s) {sorted(set(levels) - set(LEVELS))} (strict, shared, loose)")
    model, tokenizer = load_model_and_tokenizer(config)

    def factory(level_config: KevConfig) -> Engine:  # one model for every level's engine
        return Engine(level_config, build_parts(level_config, model, tokenizer))

    with progress_bar("loading") as bar:
        started = time.monotonic()

        def on_progress(label: str) -> None:  # a time bar: the soak runs for --duration seconds
            bar(label, min(time.monotonic() - started, args.duration), args.duration)

        options = StressOptions(args.duration, args.questions, args.max_tokens, levels, args.seed,
                                on_progress=on_progress)
        report = run_stress(factory, config, options)
    return report_and_exit_code(report, args.json, print_report)


def print_report(report: StressReport) -> None:
    console = Console(width=120)
    table = Table(title=f"kev stress: {report.duration_s:.0f} s, seed {report.seed}")
    table.add_column("", justify="left")
    for level in report.levels:
        table.add_column(level.level, justify="right")
    rows = [("questions (distinct)", "questions"), ("waves", "waves"), ("submitted", "submitted"),
            ("completed", "completed"), ("failed", "failed"), ("timed out", "timed_out"),
            ("cancelled at the end", "cancelled"), ("cut by max_context", "truncated")]
    for label, name in rows:
        table.add_row(label, *(str(getattr(level, name)) for level in report.levels))
    for kind in ALERT_KINDS:
        note = " (expected)" if kind in EXPECTED_IN_SOAK else ""
        table.add_row(f"alert {kind}{note}", *("not collected" if level.alerts is None
                                               else str(level.alerts.get(kind, 0)) for level in report.levels))
    table.add_row("audit records read", *(str(level.audit_records) for level in report.levels))
    table.add_row("equal to solo (checked / answered)",
                  *(f"{level.solo_matched}/{level.solo_checked} of {level.solo_distinct}" for level in report.levels))
    console.print(table)
    for level in report.levels:
        for problem in level.problems:
            console.print(f"[red]{level.level}[/] {problem}")
    console.print("[green]OK[/]" if report.ok else "[red]NOT OK[/]")
