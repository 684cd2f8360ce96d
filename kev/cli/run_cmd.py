"""kev run "q1" "q2" ...: one engine run, then the channel table (or JSON lines)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kev.results.result import Result
from kev.cli.common import add_config_flags, config_from_args
from kev.cli.flags import add_engine_flags
from kev.cli.progress import progress_bar
from kev.engine.engine import Engine
from kev.errors import InvalidRequestError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queries", nargs="*", help="questions, one argument each; - reads them from stdin, one a line")
    parser.add_argument("--file", type=Path, help="read questions from this file, one a line (blank lines skipped)")
    add_config_flags(parser)
    add_engine_flags(parser)
    parser.add_argument("--max-tokens", type=int, help="new tokens per question")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--isolation", choices=["strict", "shared", "loose"])
    parser.add_argument("--system", help="a shared system prompt")
    parser.add_argument("--timeout-ms", type=int, help="per-question timeout (default: router.default_timeout_ms)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for all answers")
    parser.add_argument("--json", action="store_true", help="one JSON object per result per line")


def read_queries(args: argparse.Namespace) -> list[str]:
    """The arguments, with `-` standing for stdin's lines, then the lines of --file."""
    queries: list[str] = []
    for query in args.queries:
        queries += _lines(sys.stdin.read()) if query == "-" else [query]
    if args.file is not None:
        try:
            queries += _lines(args.file.read_text(encoding="utf-8"))
        except OSError as err:
            raise InvalidRequestError(f"--file {args.file}: {err.strerror or err}") from None
    if not queries:
        raise InvalidRequestError("no questions: give them as arguments, with --file, or one a line on stdin with -")
    return queries


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def run(args: argparse.Namespace) -> int:
    queries = read_queries(args)
    config = config_from_args(args)
    with progress_bar("loading the model") as bar, Engine(config, background=False) as engine:
        # one batch: the caller drives the steps (docs/design.md), here, so the bar moves as answers come in
        request_id = engine.submit(queries, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                                   isolation=args.isolation, system=args.system, timeout_ms=args.timeout_ms)
        deadline = time.monotonic() + args.timeout
        while engine.has_work() and time.monotonic() < deadline:
            engine.step()
            done = len(engine.results(request_id))
            bar(f"{done}/{len(queries)} answered, {engine.num_steps} steps", done, len(queries))
        if engine.has_work():  # --timeout passed: what is unfinished ends cancelled, its text so far kept
            engine.cancel(request_id)
        results = engine.wait(request_id)
        steps = engine.num_steps
    if args.json:
        for result in results:
            print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print_table(results, steps)
    return 0 if all(r.status == "ok" for r in results) else 1


def print_table(results: list[Result], steps: int) -> None:
    table = Table(title=f"{len(results)} questions, {steps} engine steps "
                        "(each step = one forward over every active channel)")
    for column in ("channel_id", "elapsed_ms", "prompt", "completion", "finish", "text"):
        table.add_column(column, overflow="fold")
    for r in results:
        text = r.text.strip() if r.status == "ok" else f"[{r.status}: {r.error}] {r.text.strip()}"
        table.add_row(str(r.channel_id), f"{r.elapsed_ms:.0f}", str(r.prompt_tokens), str(r.completion_tokens),
                      r.finish_reason or "", text)
    Console(width=160).print(table)
