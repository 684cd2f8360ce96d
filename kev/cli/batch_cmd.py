"""kev batch IN -o OUT: a file of requests (OpenAI Batch JSONL, plain JSONL or .txt) answered into OUT, resumable.

Run it again with the same arguments after a kill and it does only what OUT lacks.
Exit status: 0 every line answered, 1 some lines failed (their error lines are in OUT),
2 invalid input or config (nothing was run), 130 interrupted (run it again to resume).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Literal

from kev.cli.common import add_config_flags, config_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="requests, one per line: OpenAI Batch JSONL, {\"prompt\"}/{\"messages\"} JSONL, "
                                      "or .txt (one question per line); '-' reads standard input")
    parser.add_argument("-o", "--output", required=True, help="answers in OpenAI Batch output format, appended; "
                                                              "'-' writes standard output (no resume)")
    add_config_flags(parser)
    parser.add_argument("--format", choices=["jsonl", "txt"], help="input format (default: txt for *.txt, else jsonl)")
    parser.add_argument("--ordered", action="store_true", help="write in input order (default: as answers finish)")
    parser.add_argument("--max-inflight", type=int,
                        help="requests in flight at once (default: batch.max_inflight, "
                             "else 2 x channel_pool_size x (1 + channel_queue_depth) per engine)")
    parser.add_argument("--skip-invalid", action="store_true", help="write invalid lines as error lines, run the rest")
    parser.add_argument("--max-tokens", type=int, help="max_tokens of lines that do not set it")
    parser.add_argument("--temperature", type=float,
                        help="temperature of lines that do not set it (OpenAI's default: 1)")
    parser.add_argument("--tenant", help="whose requests these are: under isolation loose, a prompt prefix is cached "
                                         "for this tenant only (as a server's API key names it; default: default)")
    parser.add_argument("--quiet", action="store_true", help="no progress and no summary on stderr")
    parser.add_argument("--json-summary", metavar="FILE", help="write the summary numbers as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    from kev.cli.batch_job import JobOptions, prepare, read_source
    from kev.cli.batch_job import run as run_job
    from kev.config.server_config import TENANT_NAME
    from kev.errors import KevError

    if args.max_inflight is not None and args.max_inflight < 1:
        raise KevError("--max-inflight: at least 1")
    if args.tenant is not None and not TENANT_NAME.match(args.tenant):
        raise KevError(f"--tenant: {args.tenant!r} is not a tenant name (letters, digits, '_', '.', '-')")
    config = config_from_args(args)
    defaults = {key: value for key, value in (("max_tokens", args.max_tokens), ("temperature", args.temperature))
                if value is not None}
    options = JobOptions(None if args.output == "-" else Path(args.output), args.ordered, args.max_inflight,
                         args.skip_invalid, args.quiet, defaults, args.tenant)
    lines, source = read_source(args.input)
    fmt: Literal["jsonl", "txt"] = "txt" if (args.format or "jsonl") == "txt" or (
        args.format is None and args.input.endswith(".txt")) else "jsonl"
    try:
        job = prepare(config, lines, fmt, source, options)
        tally = run_job(config, job, options)
    except KeyboardInterrupt:  # before the job's own Ctrl-C handling is in place (reading, loading)
        print("kev batch: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    if args.json_summary:
        Path(args.json_summary).write_text(json.dumps({**tally.summary(), "output": args.output}, indent=1) + "\n")
    if not args.quiet:
        print(f"kev batch: {tally.summary_line()}", file=sys.stderr)
        if tally.interrupted:
            print(f"kev batch: stopped; {tally.total - tally.num_done} request(s) left. Resume with the same command:\n"
                  f"  kev {shlex.join(sys.argv[1:])}", file=sys.stderr)
    if tally.interrupted:
        return 130
    return 1 if tally.num_failed else 0
