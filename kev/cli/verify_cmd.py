"""kev verify: prove isolation on this machine: packed answers equal solo answers, and no secret leaks."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from kev.cli.common import add_config_flags, config_from_args, report_and_exit_code
from kev.cli.progress import progress_bar
from kev.config import load_config
from kev.engine.engine import Engine
from kev.isolation.levels import LEVELS, config_for_level
from kev.isolation.verify import (DEFAULT_SYSTEM, VERIFY_QUESTIONS, VerifyOptions, VerifyReport, read_questions,
                                  run_verify)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--questions", help="a file with one question per line (default: a built-in mixed set)")
    parser.add_argument("--n", type=int, help="use the first N questions")
    parser.add_argument("--trials", type=int, default=3, help="random mixes (the last one carries the canary)")
    parser.add_argument("--level", choices=LEVELS, help="isolation level to prove (default: the config's)")
    parser.add_argument("--max-tokens", type=int, default=6, help="new tokens per question")
    parser.add_argument("--system", help="system prompt for every question (shared/loose default: a built-in one)")
    parser.add_argument("--seed", type=int, help="seed of the mixes (printed, so a failure can be replayed)")
    parser.add_argument("--speculative", action="store_true",
                        help="prove drafts change nothing: solo answers decode plainly, every mix with prompt-lookup "
                             "drafts (the config's speculative settings; extraction questions join the set)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    base = config_from_args(args)
    level = args.level or base.isolation.level
    system = args.system or (DEFAULT_SYSTEM if level != "strict" else None)
    config = config_for_level(base, level, system or DEFAULT_SYSTEM)
    if args.speculative:  # the proof needs drafts, whatever the measured policy would say they are worth here
        config = load_config(config, {"speculative": {"policy": "rows"}})
    if level == "loose":
        system = None if system == config.isolation.system_prompt else system  # the declared prompt is the public one
    questions = read_questions(args.questions) if args.questions else VERIFY_QUESTIONS
    options = VerifyOptions(questions[:args.n] if args.n else questions, args.trials, level, args.max_tokens,
                            system, seed=args.seed, speculative=args.speculative)
    with progress_bar("loading the model") as bar, Engine(config, record_logits=True, background=False) as engine:
        report = run_verify(engine, options, bar)
    return report_and_exit_code(report, args.json, print_report)


def print_report(report: VerifyReport) -> None:
    against = "alone without drafts" if report.speculative else "alone"
    table = Table(title=f"isolation level {report.level}: each answer vs the same question {against} "
                        f"({report.trials} random mixes, seed {report.seed})")
    for column in ("question", "solo tokens", "identical", "max |Δlogit|", "channels"):
        table.add_column(column, overflow="fold", justify="left" if column == "question" else "right")
    for check in [*report.checks, report.canary_check]:
        name = check.question if len(check.question) <= 48 else check.question[:45] + "..."
        table.add_row(name, str(check.solo_tokens), f"{check.identical}/{check.trials}",
                      f"{check.max_abs_logit_diff:.3g}", ",".join(map(str, sorted(check.channels))))
    console = Console(width=120)
    console.print(table)
    for check in [*report.checks, report.canary_check]:
        for problem in check.problems:
            console.print(f"[red]differs[/] {check.question[:40]!r}: {problem}")
    for leak in report.leaks:
        console.print(f"[red]canary leak[/] {leak}")
    if report.speculative:
        rate = report.accepted_tokens / report.drafted_tokens if report.drafted_tokens else 0.0
        console.print(f"speculative: mixes drafted {report.drafted_tokens} tokens, accepted {report.accepted_tokens} "
                      f"({rate:.0%}); solo references decoded without drafts")
    verdict = "[green]OK[/]" if report.ok else "[red]NOT OK[/]"
    console.print(f"{verdict}: {report.identical}/{report.comparisons} identical, max |Δlogit| "
                  f"{report.max_abs_logit_diff:.3g}, canary leaks {len(report.leaks)}, "
                  f"numerics {report.numerics_fingerprint}")
