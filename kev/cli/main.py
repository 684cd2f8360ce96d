"""`kev` command line. Each subcommand lives in its own module with add_arguments() and run()."""
from __future__ import annotations

import argparse
import importlib
import logging
import platform
import sys

from kev import __version__
from kev.cli.logs import setup_logging

# name -> (module, one-line help). A module that is not there (an optional part) is skipped.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("kev.cli.run_cmd", "answer questions in one engine run and print the channel table"),
    "bench": ("kev.cli.bench_cmd", "throughput of Kev vs serial vs Hugging Face batching"),
    "serve": ("kev.cli.serve_cmd", "the HTTP service"),
    "verify": ("kev.cli.verify_cmd", "prove isolation: packed answers equal solo answers"),
    "stress": ("kev.cli.stress_cmd", "varied-length soak that collects isolation alerts"),
    "plan": ("kev.cli.plan_cmd", "the memory bill: weights + KV per channel"),
    "stats": ("kev.cli.stats_cmd", "hash-bucket and channel load from an audit log"),
    "worker": ("kev.cli.worker_cmd", "distributed inference worker"),
    "aggregator": ("kev.cli.aggregator_cmd", "distributed result aggregator"),
    "cluster": ("kev.cli.cluster_cmd", "run a local distributed cluster"),
    "batch": ("kev.cli.batch_cmd", "answer a file of requests (OpenAI Batch format), resumable"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kev", description="Many questions, one forward pass, isolated channels.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine details to stderr")
    parser.add_argument("--version", action="version",
                        version=f"kev {__version__} (python {platform.python_version()})")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue
            raise
        command = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command)
        command.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    flag = next((a for a in unknown if a.startswith("-")), None)
    if flag is not None:  # one line naming it (argparse would print the whole usage first)
        print(f"kev {args.command}: {flag.split('=')[0]} is not a flag of kev {args.command} (a vLLM flag Kev has "
              f"no counterpart for, or a typo; `kev {args.command} --help` lists them, README's \"Coming from "
              f"vLLM\" maps vLLM's)", file=sys.stderr)
        return 2
    if unknown:
        print(f"kev {args.command}: unexpected argument {unknown[0]!r} (`kev {args.command} --help`)", file=sys.stderr)
        return 2
    setup_logging(logging.INFO if args.verbose else logging.WARNING, getattr(args, "log_format", "text"))
    if hasattr(args, "log_level"):  # serve, worker, aggregator: their own level for Kev's loggers
        logging.getLogger("kev").setLevel(args.log_level.upper())
    from kev.errors import KevError, describe_os_error

    try:
        return int(args.handler(args) or 0)
    except KevError as err:
        print(f"kev {args.command}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a read-only folder, a full disk, no permission: one line naming the path, not a traceback
        print(f"kev {args.command}: {describe_os_error(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
