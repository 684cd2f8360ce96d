"""A `kev batch` job from start to end: read and check every line, resume from the output, run the rest, summarize.

Order of events, and why: every line is checked before anything is loaded (a bad file fails
in a second, not after the model loads, and nothing is half-run); the output is read back
next (a torn last line cut off, every custom_id already there skipped); only then is the
backend opened and the remaining requests run.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kev.batch.input_file import Format, LineError, read_lines
from kev.batch.local_backend import close_backend, default_max_inflight, open_backend
from kev.batch.output_file import OutputFile, Resumed, resume
from kev.cli.batch_progress import ProgressView
from kev.batch.records import error_key, invalid_record
from kev.batch.requests import BatchRequest, RequestBuilder, build_all
from kev.batch.runner import BatchRunner
from kev.batch.tally import Tally
from kev.config import KevConfig
from kev.errors import KevError

log = logging.getLogger("kev.batch")
MAX_ERRORS_SHOWN = 20


class InvalidInputError(KevError):
    """Lines that are not valid requests; the message lists them (line number and field)."""

    def __init__(self, source: str, errors: list[LineError]) -> None:
        shown = "\n".join(f"  {source} {err}" for err in errors[:MAX_ERRORS_SHOWN])
        more = f"\n  ... and {len(errors) - MAX_ERRORS_SHOWN} more" if len(errors) > MAX_ERRORS_SHOWN else ""
        super().__init__(f"{len(errors)} invalid line(s); nothing was run (--skip-invalid writes them as error "
                         f"lines and runs the rest):\n{shown}{more}")
        self.errors = errors


@dataclass
class JobOptions:
    output: Path | None  # None: standard output
    ordered: bool = False
    max_inflight: int | None = None
    skip_invalid: bool = False
    quiet: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)  # body fields for lines that do not set them
    tenant: str | None = None  # whose requests (loose caches a private prefix per tenant); None: the default


@dataclass
class PreparedJob:
    requests: list[BatchRequest]  # still to run
    invalid: list[LineError]  # with --skip-invalid, still to write
    tally: Tally


def prepare(config: KevConfig, lines: Iterable[str], fmt: Format, source: str, options: JobOptions) -> PreparedJob:
    """Every check that needs no model; raises InvalidInputError or KevError before anything runs."""
    read, errors = read_lines(lines, fmt)
    requests, invalid = build_all(read, RequestBuilder.from_config(config, options.defaults))
    errors = sorted(errors + invalid, key=lambda e: e.line_no)
    if errors and not options.skip_invalid:
        raise InvalidInputError(source, errors)
    found = resume(options.output) if options.output is not None else Resumed()
    keys = {r.custom_id for r in requests} | {error_key(e) for e in errors}
    if stray := sorted(found.keys - keys):
        raise KevError(f"{options.output} holds custom_id {stray[0]!r}, which is not in {source}: "
                       "is it the output of another job? (use a new output file)")
    if found.torn_bytes:
        log.warning("%s: cut off a torn last line (%d bytes); its request runs again", options.output, found.torn_bytes)
    tally = Tally(len(requests) + len(errors), num_done=len(found.keys), num_failed=found.num_failed,
                  num_resumed=len(found.keys), prompt_tokens=found.prompt_tokens,
                  completion_tokens=found.completion_tokens)
    return PreparedJob([r for r in requests if r.custom_id not in found.keys],
                       [e for e in errors if error_key(e) not in found.keys], tally)


def run(config: KevConfig, job: PreparedJob, options: JobOptions) -> Tally:
    """Write the invalid lines, run the requests; Ctrl-C (SIGINT) or SIGTERM stop cleanly (tally.interrupted)."""
    out = OutputFile(options.output)
    try:
        for err in job.invalid:
            record = invalid_record(err)
            out.write(record)
            job.tally.add(record)
        if job.requests:
            asyncio.run(_run(config, job, options, out))
    finally:
        out.close()
    return job.tally


async def _run(config: KevConfig, job: PreparedJob, options: JobOptions, out: OutputFile) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tally = job.tally
    with ProgressView(tally, options.quiet) as view:
        loading = time.monotonic()
        backend = await open_backend(config)
        tally.load_s, tally.started = time.monotonic() - loading, time.monotonic()  # rates count from here
        try:
            runner = BatchRunner(backend, RequestBuilder.from_config(config).model_name,
                                 options.max_inflight or default_max_inflight(config), options.ordered, options.tenant)

            def emit(_: BatchRequest, record: dict[str, Any]) -> None:
                out.write(record)
                tally.add(record)
                view.update()

            finished = await runner.run(job.requests, emit, stop)
            tally.interrupted = not finished
        finally:
            await close_backend(backend)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def read_source(path: str) -> tuple[list[str], str]:
    """The input's lines and its name for messages; '-' is standard input. Split at "\n" only: a JSON string may
    hold U+2028 and friends, which str.splitlines() would also split at."""
    if path == "-":
        return sys.stdin.read().split("\n"), "<stdin>"
    try:
        return Path(path).read_text(encoding="utf-8").split("\n"), path
    except FileNotFoundError:
        raise KevError(f"input file not found: {path}") from None
    except UnicodeDecodeError as err:
        raise KevError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
